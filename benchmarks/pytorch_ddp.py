"""pytorch_ddp_overhead: what the platform adds to a 2-learner PyTorch DDP training.

The same DistributedDataParallel training (examples/pytorch-ddp, Gloo, a fixed amount of
work) is submitted through the platform as a `pytorch` training (submit → COMPLETED as the
platform recorded it, `Platform.run_to_end`: every learner runs torchrun, a static
rendezvous on learner 1), and started by hand as the same two `torchrun` commands with the
same flags and script, in the runtime pytorch2.13, in pairs, back to back, the order
swapped every pair (as training_overhead: the shared machine drifts, a pair's ratio
cancels the drift). The ratio is the median over the pairs of platform / by hand. Target:
<= 1.05.

The runtime is built on first use into DLAAS_RUNTIMES_DIR (default
~/.cache/dlaas/runtimes, the directory the tests build it in).

    python benchmarks/pytorch_ddp.py [--quick]
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx
import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    ROOT,
    Platform,
    Row,
    dlaas_up,
    free_port,
    median,
    steal_into,
)
from benchmarks.ddl_allreduce import runtimes_dir
from service import runtimes
from worker.launchers.torchrun import script_argv

RUNTIME = "pytorch2.13"
EXAMPLE = ROOT / "examples" / "pytorch-ddp"
# One operator thread per learner, on both sides: the two learners share this machine's
# cores, and with torch's default (a thread per core each) the job oversubscribed them,
# its OpenMP threads spinning while they waited for each other; the same commands by hand
# then took 14-25 s from one run to the next and the pairs read 0.85-1.41.
THREADS = " --threads 1"


def command(samples: int) -> str:
    """The training: the torchscript exporter at the end (about a second) and one operator
    thread per learner, on both sides."""
    return (
        f"python train.py --epochs 4 --samples {samples} --batch-size 256 "
        f"--onnx-exporter torchscript{THREADS}"
    )


def code_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(EXAMPLE / "train.py", "train.py")
    return buf.getvalue()


def by_hand(runtime: runtimes.RuntimeInfo, samples: int) -> float:
    """Both learners' torchrun started by hand on this machine, with the flags the
    platform gives them (the rendezvous on 127.0.0.1) and the learner variables."""
    script, _ = script_argv(command(samples))
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "train.py").write_bytes((EXAMPLE / "train.py").read_bytes())
        start = time.monotonic()
        procs = []
        for i in (1, 2):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DLAAS_"))}
            env.update(
                PATH=f"{runtime.bin_dir}:/usr/local/bin:/usr/bin:/bin",
                PYTHONUNBUFFERED="1",
                LEARNER_ID=str(i),
                NUM_LEARNERS="2",
                TRAINING_ID="by-hand",
                MODEL_DIR=str(code),
                RESULT_DIR=str(Path(tmp) / "results"),
                CHECKPOINT_DIR=str(Path(tmp) / "checkpoints"),
                LOG_DIR=str(Path(tmp) / f"logs-{i}"),
            )
            argv = [
                "torchrun",
                "--nnodes=2",
                f"--node_rank={i - 1}",
                "--nproc_per_node=1",
                "--rdzv_backend=static",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--max_restarts=0",
                *script,
            ]
            procs.append(
                subprocess.Popen(
                    argv,
                    cwd=code,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # as the platform starts its learners
                )
            )
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError("a learner's torchrun started by hand failed")
        return time.monotonic() - start


def through_platform(platform: Platform, http: httpx.Client, samples: int) -> tuple[float, float]:
    """Submit → COMPLETED, and how much of it was before RUNNING (the platform's start)."""
    manifest = yaml.safe_dump(
        {
            "name": "bench-ddp",
            "framework": {"name": "pytorch", "version": "2.13", "command": command(samples)},
            "compute_configuration": {"name": "P100", "nodes": 2},
        }
    )
    took, to_running, done = platform.run_to_end(http, manifest, code_zip())
    if done["status"] != "COMPLETED" or to_running is None:
        raise RuntimeError(f"the training failed: {done['status_message']}")
    return took, to_running


def run(quick: bool) -> list[Row]:
    # The job: 48,000 samples, about 11 s on a quiet machine, 5 of them torch's start. At
    # 12,000 (8 s) the platform's fixed cost of a training (0.2-0.4 s from the POST to the
    # learners' first status: admission, the network, the sandboxes, the wrappers; 0.05 s
    # from their end to COMPLETED) was 4% of it, and the pairs' ratios ran 0.99-1.15 on
    # the same machine within minutes: more pairs, not a looser target.
    pairs_wanted = 5 if quick else 7
    samples = 48_000 if quick else 64_000
    root = runtimes_dir()
    runtime = runtimes.install(RUNTIME, root, progress=lambda line: print(line, file=sys.stderr))
    platform_times: list[float] = []
    hand_times: list[float] = []
    with dlaas_up(DLAAS_RUNTIMES_DIR=str(root)) as platform, platform.client() as http:
        # Warm-up: the worker's first task, and torch's files in the page cache.
        through_platform(platform, http, 512)
        starts: list[float] = []
        platform_steal: list[float | None] = []
        hand_steal: list[float | None] = []
        for i in range(pairs_wanted):
            if i % 2:
                with steal_into(hand_steal):
                    hand_times.append(by_hand(runtime, samples))
            with steal_into(platform_steal):
                took, start = through_platform(platform, http, samples)
            platform_times.append(took)
            starts.append(start)
            if not i % 2:
                with steal_into(hand_steal):
                    hand_times.append(by_hand(runtime, samples))
    pairs = [p / h for p, h in zip(platform_times, hand_times, strict=True)]
    return [
        Row(
            "pytorch_ddp_overhead",
            round(median(platform_times), 2),
            "s",
            baseline=round(median(hand_times), 2),
            ratio=round(median(pairs), 3),
            detail={
                "ratio": "median over the pairs of platform / the same torchrun by hand",
                "pair_ratios": [round(x, 3) for x in pairs],
                "platform_runs": [round(x, 2) for x in platform_times],
                "by_hand_runs": [round(x, 2) for x in hand_times],
                "learners": 2,
                "samples": samples,
                "submit_to_running_s": [round(x, 3) for x in starts],
                # The hypervisor's share of the CPUs during each run (/proc/stat's steal).
                "platform_steal_share": platform_steal,
                "by_hand_steal_share": hand_steal,
                "target": "ratio <= 1.05",
            },
        ).emit()
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
