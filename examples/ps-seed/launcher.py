"""Seed-style launcher: turn the learner environment into a ps/worker role and run model.py.

Every learner runs the same command (``python3 launcher.py --steps 200``).  The launcher decides
what this learner is and ``exec``s ``model.py`` with the classic distributed-TensorFlow flags
(``--ps_hosts --worker_hosts --job_name --task_index``) plus every argument it was given.

Addresses come from ``TF_CONFIG`` when the platform sets it (it always does for distributed
tensorflow jobs; ports may differ from 2222, e.g. the 127.0.0.1 fallback).  Without it they are
built the way the WML documentation describes: learner i is ``$LEARNER_NAME_PREFIX-$i:2222``
and learners 1..P (``PS_HOSTS_COUNT``, default 1 when NUM_LEARNERS > 1) are parameter servers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent


def roles(env: Mapping[str, str], port: int = 2222) -> tuple[list[str], list[str], str, int]:
    """(ps hosts, worker hosts, job name, task index) of this learner."""
    raw = env.get("TF_CONFIG", "").strip()
    if raw:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        ps, workers = list(cluster.get("ps", [])), list(cluster.get("worker", []))
        job, index = str(task["type"]), int(task["index"])
        if job not in ("ps", "worker"):
            raise ValueError(f"TF_CONFIG task type {job!r}: this example knows ps and worker")
    else:
        learners = int(env.get("NUM_LEARNERS") or 1)
        learner = int(env.get("LEARNER_ID") or 1)
        default_ps = "1" if learners > 1 else "0"
        ps_count = int(env.get("PS_HOSTS_COUNT") or default_ps)
        prefix = env.get("LEARNER_NAME_PREFIX", "")
        if prefix:
            addresses = [f"{prefix}-{i}:{port}" for i in range(1, learners + 1)]
        else:  # outside the platform: one process on this machine
            addresses = [f"localhost:{port + i - 1}" for i in range(1, learners + 1)]
        ps, workers = addresses[:ps_count], addresses[ps_count:]
        if learner <= ps_count:
            job, index = "ps", learner - 1
        else:
            job, index = "worker", learner - 1 - ps_count
    if not workers:
        raise ValueError("no worker tasks: need NUM_LEARNERS > PS_HOSTS_COUNT")
    if not 0 <= index < len(ps if job == "ps" else workers):
        raise ValueError(f"task index {index} out of range for job {job}")
    return ps, workers, job, index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=2222, help="gRPC port without TF_CONFIG")
    args, rest = parser.parse_known_args(argv)
    try:
        ps, workers, job, index = roles(os.environ, args.port)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"launcher error: {exc}", file=sys.stderr, flush=True)
        return 2
    source = "TF_CONFIG" if os.environ.get("TF_CONFIG", "").strip() else "LEARNER_NAME_PREFIX"
    print(
        f"learner={os.environ.get('LEARNER_ID', '1')} job={job} task={index} from={source}"
        f" ps_hosts={','.join(ps)} worker_hosts={','.join(workers)}",
        flush=True,
    )
    command = [sys.executable, "-u", str(HERE / "model.py")]
    command += [f"--ps_hosts={','.join(ps)}", f"--worker_hosts={','.join(workers)}"]
    command += [f"--job_name={job}", f"--task_index={index}", *rest]
    os.execv(sys.executable, command)  # noqa: S606 - same process: exit code and signals are model.py's


if __name__ == "__main__":
    sys.exit(main())
