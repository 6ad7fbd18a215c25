"""One rank of the ddl_allreduce_busbw benchmark, run under `mpirun -np N` in the runtime
ddl-tf2.14: `ddl.all_reduce_n` of a list of float32 tensors against a plain mpi4py
Allreduce of the same buffers, alternating round by round; rank 0 prints one JSON line.

    python allreduce_busbw.py --bytes 67108864 --tensors 1 --rounds 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import ddl  # initialises Horovod (and MPI) before mpi4py attaches to it
import numpy as np
import tensorflow as tf
from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=64 * 2**20)
    parser.add_argument("--tensors", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    assert size == ddl.size() and rank == ddl.rank()
    count = args.bytes // 4 // args.tensors
    rng = np.random.default_rng(rank)
    arrays = [rng.standard_normal(count, dtype=np.float32) for _ in range(args.tensors)]
    tensors = [tf.constant(a) for a in arrays]
    received = [np.empty_like(a) for a in arrays]
    total = sum(a.nbytes for a in arrays)

    def ddl_round() -> float:
        comm.Barrier()
        started = time.perf_counter()
        out = ddl.all_reduce_n(tensors, op="sum")
        elapsed = time.perf_counter() - started
        assert len(out) == len(tensors)
        return elapsed

    def mpi_round() -> float:
        comm.Barrier()
        started = time.perf_counter()
        for a, r in zip(arrays, received, strict=True):
            comm.Allreduce(a, r, op=MPI.SUM)
        return time.perf_counter() - started

    # The two agree (what is measured is the same reduction).
    reference = [np.asarray(t) for t in ddl.all_reduce_n(tensors, op="sum")]
    mpi_round()
    for a, b in zip(reference, received, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for _ in range(args.warmup):
        ddl_round()
        mpi_round()
    ddl_times, mpi_times = [], []
    for i in range(args.rounds):
        # The order swapped every round, so that neither always runs first.
        if i % 2:
            mpi_times.append(mpi_round())
            ddl_times.append(ddl_round())
        else:
            ddl_times.append(ddl_round())
            mpi_times.append(mpi_round())
    # A round lasts as long as its slowest rank.
    ddl_times = [max(ts) for ts in zip(*comm.allgather(ddl_times), strict=True)]
    mpi_times = [max(ts) for ts in zip(*comm.allgather(mpi_times), strict=True)]
    if rank == 0:
        factor = 2 * (size - 1) / size  # busbw = algbw x 2(n-1)/n, as nccl-tests defines it
        ddl_s, mpi_s = statistics.median(ddl_times), statistics.median(mpi_times)
        print(
            json.dumps(
                {
                    "ranks": size,
                    "bytes": total,
                    "tensors": len(arrays),
                    "ddl_seconds": ddl_times,
                    "mpi_seconds": mpi_times,
                    "ddl_busbw_gbs": total / ddl_s * factor / 1e9,
                    "mpi_busbw_gbs": total / mpi_s * factor / 1e9,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
