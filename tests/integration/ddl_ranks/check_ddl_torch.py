"""Run under `mpirun -np N` in the runtime pytorch2.13: every collective of the open DDL's
PyTorch API (`ddl`, runtimes/packages/ddl-torch) against numpy references computed from
what every rank contributes; prints `rank=R ok` when all hold, and a JSON line of what it
saw."""

from __future__ import annotations

import atexit
import json
import sys
import time

# Rank 0 stays this long after its work, as a rank 0 exporting the model does.
RANK_0_STAYS = 1.0


def _after_ddl_exits() -> None:
    """Registered before `import ddl`, so it runs after ddl's exit handler (atexit runs
    them last in, first out): the process group is gone before the interpreter finalizes,
    so no Gloo thread is left to touch it, and no rank destroyed it before every rank had
    finished (rank 0 leaves last)."""
    import torch.distributed as dist

    print(f"rank={R} at exit the process group is initialized: {dist.is_initialized()}")
    print(f"rank={R} destroyed its process group at {time.time():.6f}", flush=True)


atexit.register(_after_ddl_exits)

import ddl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

R, N = ddl.rank(), ddl.size()


def contribution(r: int) -> list[np.ndarray]:
    """What rank r contributes: mixed shapes and dtypes, distinct per rank."""
    rng = np.random.default_rng(100 + r)
    return [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.standard_normal(7).astype(np.float64),
        np.array(r + 0.5, dtype=np.float32),
        (np.arange(6, dtype=np.int32).reshape(2, 3) + 10 * r),
        rng.standard_normal((2, 2, 2)).astype(np.float16),
        np.arange(5, dtype=np.int64) * (r + 1),
    ]


everyone = [contribution(r) for r in range(N)]
mine = everyone[R]
TOL = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}


def close(got: torch.Tensor, want: np.ndarray) -> None:
    g = got.numpy()
    assert g.shape == want.shape and g.dtype == want.dtype, (g.shape, g.dtype, want.shape)
    if np.issubdtype(want.dtype, np.integer):
        assert np.array_equal(g, want), (g, want)
    else:
        tol = TOL[want.dtype.type]
        assert np.allclose(g, want, rtol=tol, atol=tol), (g, want)


def tensors() -> list[torch.Tensor]:
    return [torch.from_numpy(a.copy()) for a in mine]


# sum, mixed shapes and dtypes in one call; the arguments are left as they were
args = tensors()
summed = ddl.all_reduce_n(args, op="sum")
for i, got in enumerate(summed):
    close(got, np.sum([e[i] for e in everyone], axis=0).astype(mine[i].dtype))
    close(args[i], mine[i])

# avg (integers truncate)
for i, got in enumerate(ddl.all_reduce_n(tensors(), op="avg")):
    total = np.sum([e[i].astype(np.float64) for e in everyone], axis=0)
    if np.issubdtype(mine[i].dtype, np.integer):
        want = np.trunc(total / N).astype(mine[i].dtype)
    else:
        want = (total / N).astype(mine[i].dtype)
    close(got, want)

# the MPI baseline gives the same
for got, h in zip(ddl.all_reduce_n(tensors(), op="sum", mpi=True), summed, strict=True):
    close(got, h.numpy())

# check: passes on a correct result ...
ddl.all_reduce_n(tensors(), op="avg", check=1e-6)
# ... and detects a wrong one: torch.distributed's reduction made wrong on rank 0 only.
right = dist.all_reduce


def wrong(tensor: torch.Tensor, *a: object, **k: object) -> None:
    right(tensor, *a, **k)
    tensor.add_(1)


if R == 0:
    dist.all_reduce = wrong
detected = False
try:
    ddl.all_reduce_n([torch.from_numpy(mine[0].copy())], op="sum", check=1e-6)
except ddl.CheckError as e:
    detected = True
    print(f"rank={R} detected: {e}", flush=True)
dist.all_reduce = right
assert detected is (R == 0), detected
ddl.all_reduce_n([torch.from_numpy(mine[0].copy())], op="sum", check=1e-6)

# bcast: rank 0's tensor everywhere
close(ddl.bcast(torch.from_numpy(mine[0].copy())), everyone[0][0])

# broadcast_parameters: every parameter and buffer takes rank 0's value
module = torch.nn.BatchNorm1d(4)
with torch.no_grad():
    module.weight.fill_(R + 1.0)
    module.running_mean.fill_(R + 2.0)
ddl.broadcast_parameters(module)
close(module.weight.detach(), np.full(4, 1.0, np.float32))
close(module.running_mean, np.full(4, 2.0, np.float32))

# the optimizer averages gradients: d/dw sum(w * x_r) = x_r, averaged over ranks
w = torch.nn.Parameter(torch.zeros(4))
optimizer = ddl.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), check=1e-6)
x = torch.arange(4, dtype=torch.float32) * (R + 1)
(w * x).sum().backward()
optimizer.step()
mean_scale = float(np.mean(np.arange(1, N + 1)))
close(w.detach(), -np.arange(4, dtype=np.float32) * np.float32(mean_scale))

print(
    json.dumps(
        {
            "rank": R,
            "size": N,
            "local_rank": ddl.local_rank(),
            "local_size": ddl.local_size(),
            "backend": ddl.backend(),
        }
    ),
    flush=True,
)
print(f"rank={R} ok", flush=True)
if R == 0:
    time.sleep(RANK_0_STAYS)
    print(f"rank=0 leaves at {time.time():.6f}", flush=True)
sys.exit(0)
