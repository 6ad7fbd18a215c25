"""ddl_allreduce_busbw: the open DDL's AllReduceN against plain MPI.

Bus bandwidth (busbw = algbw x 2(n-1)/n, as nccl-tests defines it) of `ddl.all_reduce_n`
summing 64 MiB of float32 across 2 ranks on this machine, against a plain mpi4py
`Allreduce` of the same buffers, both in the runtime ddl-tf2.14 under its `mpirun`,
alternating round by round in one run (benchmarks/ranks/allreduce_busbw.py). Target:
ratio >= 0.9. The runtime is built on first use into DLAAS_RUNTIMES_DIR (default
~/.cache/dlaas/runtimes, the directory the tests build it in).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from benchmarks.common import ROOT, Row, median
from service import runtimes
from tests.mpirun import mpirun

RUNTIME = "ddl-tf2.14"
SCRIPT = ROOT / "benchmarks" / "ranks" / "allreduce_busbw.py"
MIB_64 = 64 * 2**20


def runtimes_dir() -> Path:
    configured = os.environ.get("DLAAS_RUNTIMES_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "dlaas" / "runtimes"


def measure(
    runtime: runtimes.RuntimeInfo, ranks: int, tensors: int, rounds: int
) -> dict[str, float]:
    done = mpirun(
        runtime,
        ranks,
        SCRIPT,
        *("--bytes", str(MIB_64), "--tensors", str(tensors), "--rounds", str(rounds)),
        timeout=600,
        env={"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")},
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"mpirun exited {done.returncode}:\n{tail}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
    result: dict[str, float] = json.loads(line)
    return result


def run(quick: bool) -> list[Row]:
    runtime = runtimes.install(
        RUNTIME, runtimes_dir(), progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    rounds = 10 if quick else 30
    result = measure(runtime, ranks=2, tensors=1, rounds=rounds)
    ddl_bw, mpi_bw = result["ddl_busbw_gbs"], result["mpi_busbw_gbs"]
    return [
        Row(
            "ddl_allreduce_busbw",
            round(ddl_bw, 3),
            "GB/s",
            baseline=round(mpi_bw, 3),
            ratio=round(ddl_bw / mpi_bw, 3),
            detail={
                "ratio": "busbw of ddl.all_reduce_n / busbw of mpi4py Allreduce, same buffers",
                "bytes": result["bytes"],
                "ranks": result["ranks"],
                "tensors": result["tensors"],
                "rounds": rounds,
                "ddl_median_ms": round(median(result["ddl_seconds"]) * 1000, 2),
                "mpi_median_ms": round(median(result["mpi_seconds"]) * 1000, 2),
                "runtime": runtime.prefix,
                "target": "ratio >= 0.9",
            },
        ).emit()
    ]
