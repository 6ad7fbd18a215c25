"""Data-parallel training over MPI: the Horovod / DDL pattern with mpi4py and numpy.

For ``tensorflow-horovod`` and ``tensorflow-ddl`` jobs: learner 1 runs the command under
``mpirun`` with one rank per learner (per GPU on GPU machines).  Horovod 0.28.1 does not build
against TensorFlow 2.21, so this shows the same recipe without it: broadcast the initial weights
from rank 0 (``hvd.broadcast_global_variables``), then every step each rank computes gradients
on its own shard, the gradients are averaged with an allreduce (``hvd.DistributedOptimizer``)
and every rank applies the same update, so the replicas stay identical.

Needs: an MPI launch (a single plain ``python train.py`` also works, as one rank), RESULT_DIR.
Optional: DDL_OPTIONS (printed when set).  Flags: --steps (default 50), --batch-size (32, per
rank), --learning-rate (0.1).
Prints: ``rank=<r> size=<n> host=<hostname> learner=<LEARNER_ID>`` per rank, then
``rank=<r> step=<n> loss=<v>`` per step (the loss is the mean over all ranks).
Writes (rank 0): $RESULT_DIR/allreduce.json = {"size", "hosts" (every rank's host name, in
rank order), "sum" (allreduce of rank + 1, i.e. size*(size+1)/2), "loss", "weights",
"in_sync"}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

TRUE_W = np.array([3.0, -2.0])
TRUE_B = 0.5


def make_shard(rank: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    x = rng.uniform(-1.0, 1.0, size=(samples, 2))
    return x, x @ TRUE_W + TRUE_B + rng.normal(0.0, 0.05, size=samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--samples", type=int, default=1024, help="examples per rank")
    args = parser.parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    host = socket.gethostname()
    print(
        f"rank={rank} size={size} host={host} learner={os.environ.get('LEARNER_ID', '')}",
        flush=True,
    )
    if os.environ.get("DDL_OPTIONS"):
        print(f"rank={rank} DDL_OPTIONS={os.environ['DDL_OPTIONS']}", flush=True)

    # Replicas start from rank 0's weights (each rank draws different ones to show it matters).
    params = np.random.default_rng(rank).normal(0.0, 1.0, size=3)  # w1, w2, b
    comm.Bcast(params, root=0)

    x_data, y_data = make_shard(rank, args.samples)
    rng = np.random.default_rng(1000 + rank)
    grad = np.empty(3)
    started = time.monotonic()
    loss = float("nan")
    for step in range(1, args.steps + 1):
        batch = rng.integers(0, len(x_data), size=args.batch_size)
        x, y = x_data[batch], y_data[batch]
        err = x @ params[:2] + params[2] - y
        local_grad = np.concatenate([2.0 * x.T @ err, [2.0 * err.sum()]]) / len(err)
        comm.Allreduce(local_grad, grad, op=MPI.SUM)  # the allreduce of data parallelism
        params -= args.learning_rate * grad / size
        loss = comm.allreduce(float(np.mean(err**2)), op=MPI.SUM) / size
        print(f"rank={rank} step={step} loss={loss:.6f}", flush=True)
    seconds = time.monotonic() - started

    hosts = comm.gather(host, root=0)
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    all_params = comm.gather(params, root=0)
    if rank == 0:
        in_sync = all(np.array_equal(p, params) for p in all_params)
        report = {
            "size": size,
            "hosts": hosts,
            "sum": total,
            "loss": loss,
            "weights": {"w": params[:2].tolist(), "b": float(params[2])},
            "in_sync": in_sync,
            "seconds": round(seconds, 3),
        }
        result_dir = Path(os.environ.get("RESULT_DIR") or "results")
        result_dir.mkdir(parents=True, exist_ok=True)
        (result_dir / "allreduce.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"rank=0 hosts={','.join(hosts)} sum={total} in_sync={in_sync}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
