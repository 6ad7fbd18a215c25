"""hvd_synthetic_overhead: a distributed training's throughput through the platform against
the same job started by hand.

The job is benchmarks/ranks/hvd_synthetic.py (a synthetic benchmark measured the way
Horovod's own TensorFlow 2 synthetic benchmark measures: a Keras application model,
MobileNet of width 0.25 on 64x64 random images, batch 8 per rank, on the CPU, warm-up
batches, then images/s per iteration), 2 ranks in the runtime horovod-tf2.14: submitted as
a `tensorflow-horovod` training of 2 learners through `dlaas up` (learner 1 runs it under
the runtime's mpirun, each rank in its learner's sandbox), and started by hand with the
same runtime's `mpirun -np 2 --bind-to none --map-by slot` on this machine (Horovod's own
launch line, as the platform's; with Open MPI's default binding, each rank on a core of
its own, by hand ran at 0.8 of the platform's speed). Runs alternate (platform, by hand, by hand,
platform, ...), and the ratio is the median over the pairs of platform images/s over by-hand
images/s, each run's figure the mean of its timed iterations. Target: >= 0.95. The runtime
is built on first use into DLAAS_RUNTIMES_DIR (default ~/.cache/dlaas/runtimes).

    python benchmarks/hvd_synthetic.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, Platform, Row, dlaas_up, manifest, median, zip_code
from benchmarks.ddl_allreduce import runtimes_dir
from service import runtimes

RUNTIME = "horovod-tf2.14"
SCRIPT = ROOT / "benchmarks" / "ranks" / "hvd_synthetic.py"


def result_of(output: str) -> dict[str, float]:
    """The `hvd_synthetic {json}` line rank 0 printed."""
    for line in output.splitlines():
        _, found, rest = line.partition("hvd_synthetic ")
        if found and rest.startswith("{"):
            result: dict[str, float] = json.loads(rest)
            return result
    raise RuntimeError(f"no result in the output:\n{output[-3000:]}")


def by_hand(runtime: runtimes.RuntimeInfo, args: list[str]) -> dict[str, float]:
    bindir = Path(runtime.python).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OMPI_", "DLAAS_"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run(
        [str(bindir / "mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "2",
         "--bind-to", "none", "--map-by", "slot", runtime.python, str(SCRIPT), *args],
        capture_output=True, text=True, check=False, timeout=900, env=env, cwd="/",
        start_new_session=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"mpirun exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return result_of(done.stdout)


def through_platform(platform: Platform, http: httpx.Client, args: list[str]) -> dict[str, float]:
    code = zip_code({"hvd_synthetic.py": SCRIPT.read_text()})
    command = " ".join(["python3", "hvd_synthetic.py", *args])
    text = manifest(command, nodes=2, name="tensorflow-horovod", version="1.5")
    r = http.post(
        "/v1/trainings",
        files={"manifest": ("m.yaml", text), "model_definition": ("c.zip", code)},
    )
    if r.status_code != 201:
        raise RuntimeError(f"the submission was refused ({r.status_code}): {r.text}")
    t = r.json()
    done = platform.wait(http, t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=900, poll=0.5)
    logs = http.get(f"/v1/trainings/{t['id']}/logs").text
    if done["status"] != "COMPLETED":
        raise RuntimeError(
            f"the training {done['status']}: {done['status_message']}\n{logs[-3000:]}"
        )
    return result_of(logs)


def run(quick: bool) -> list[Row]:
    runtime = runtimes.install(
        RUNTIME, runtimes_dir(), progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    # CPU-only runs on a shared machine move by 10-30% from one iteration to the next (the
    # first after the warm-up batches most): more iterations and pairs, not a looser target.
    # Three pairs read 0.82, 0.94 and 1.05 in one run: their median was one pair's luck.
    pairs = 5 if quick else 7
    iterations = 8 if quick else 12
    args = ["--iterations", str(iterations), "--batches", "5", "--warmup-batches", "3"]
    platform_runs: list[dict[str, float]] = []
    hand_runs: list[dict[str, float]] = []
    with (
        dlaas_up(DLAAS_RUNTIMES_DIR=str(runtimes_dir())) as platform,
        platform.client() as http,
    ):
        # Warm-up, as the other paired rows: the worker's first task, the runtime's files
        # in the page cache. Without it the first pairs read 0.78-0.85 and the rest 0.94-1.06.
        through_platform(platform, http, ["--iterations", "1", "--batches", "2"])
        for i in range(pairs):
            if i % 2:
                hand_runs.append(by_hand(runtime, args))
            platform_runs.append(through_platform(platform, http, args))
            if not i % 2:
                hand_runs.append(by_hand(runtime, args))
    ratios = [p["mean"] / h["mean"] for p, h in zip(platform_runs, hand_runs, strict=True)]
    value, baseline = (
        median([p["mean"] for p in platform_runs]),
        median([h["mean"] for h in hand_runs]),
    )
    spread = [min(r["images_per_s"]) / max(r["images_per_s"]) for r in platform_runs + hand_runs]
    return [
        Row(
            "hvd_synthetic_overhead",
            round(value, 2),
            "images/s",
            baseline=round(baseline, 2),
            ratio=round(median(ratios), 3),
            detail={
                "ratio": "median over the pairs of platform / by-hand images/s",
                "pair_ratios": [round(r, 3) for r in ratios],
                "platform_iterations": [
                    [round(x, 1) for x in r["images_per_s"]] for r in platform_runs
                ],
                "hand_iterations": [[round(x, 1) for x in r["images_per_s"]] for r in hand_runs],
                "slowest_over_fastest_iteration": [round(s, 2) for s in spread],
                "model": "MobileNet alpha 0.25, 64x64x3, batch 8 per rank, CPU",
                "ranks": 2,
                "runtime": runtime.prefix,
                "target": "ratio >= 0.95",
            },
        ).emit()
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
