"""Run under `mpirun -np N` in the ddl runtime: every collective of `ddl` against numpy
references computed from what every rank contributes; prints `rank=R ok` when all hold,
and JSON lines of what it saw."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ddl
import numpy as np
import tensorflow as tf

R, N = ddl.rank(), ddl.size()


def contribution(r: int) -> list[np.ndarray]:
    """What rank r contributes: mixed shapes and dtypes, distinct per rank."""
    rng = np.random.default_rng(100 + r)
    return [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.standard_normal(7).astype(np.float64),
        np.float32(r + 0.5).reshape(()),
        (np.arange(6, dtype=np.int32).reshape(2, 3) + 10 * r),
        rng.standard_normal((2, 2, 2)).astype(np.float16),
        np.arange(5, dtype=np.int64) * (r + 1),
    ]


everyone = [contribution(r) for r in range(N)]
mine = everyone[R]
TOL = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}


def close(got: tf.Tensor, want: np.ndarray) -> None:
    g = got.numpy()
    assert g.shape == want.shape and g.dtype == want.dtype, (g.shape, g.dtype, want.shape)
    if np.issubdtype(want.dtype, np.integer):
        assert np.array_equal(g, want), (g, want)
    else:
        tol = TOL[want.dtype.type]
        assert np.allclose(g, want, rtol=tol, atol=tol), (g, want)


# sum, mixed shapes and dtypes in one call
summed = ddl.all_reduce_n([tf.constant(a) for a in mine], op="sum")
for i, got in enumerate(summed):
    want = np.sum([e[i] for e in everyone], axis=0).astype(mine[i].dtype)
    close(got, want)

# avg (floats; integers truncate as Horovod does)
averaged = ddl.all_reduce_n([tf.constant(a) for a in mine], op="avg")
for i, got in enumerate(averaged):
    total = np.sum([e[i].astype(np.float64) for e in everyone], axis=0)
    if np.issubdtype(mine[i].dtype, np.integer):
        want = np.trunc(total / N).astype(mine[i].dtype)
    else:
        want = (total / N).astype(mine[i].dtype)
    close(got, want)

# the MPI baseline gives the same
baseline = ddl.all_reduce_n([tf.constant(a) for a in mine], op="sum", mpi=True)
for got, h in zip(baseline, summed, strict=True):
    close(got, h.numpy())

# check: passes on a correct result ...
ddl.all_reduce_n([tf.constant(a) for a in mine], op="avg", check=1e-3)
# ... and detects a wrong one: Horovod's reduction made wrong on rank 0 only.
right = ddl._grouped_allreduce
if R == 0:
    ddl._grouped_allreduce = lambda ts, op: [t + tf.ones_like(t) for t in right(ts, op)]
detected = False
try:
    ddl.all_reduce_n([tf.constant(mine[0])], op="sum", check=1e-3)
except ddl.CheckError as e:
    detected = True
    print(f"rank={R} detected: {e}", flush=True)
ddl._grouped_allreduce = right
assert detected is (R == 0), detected
ddl.all_reduce_n([tf.constant(mine[0])], op="sum", check=1e-3)

# bcast: rank 0's tensor everywhere
b = ddl.bcast(tf.constant(everyone[R][0]))
close(b, everyone[0][0])

# broadcast_variables: every variable takes rank 0's value
variables = [tf.Variable(everyone[R][0]), tf.Variable(everyone[R][1])]
ddl.broadcast_variables(variables)
close(tf.convert_to_tensor(variables[0]), everyone[0][0])
close(tf.convert_to_tensor(variables[1]), everyone[0][1])

# the gradient tape averages gradients: d/dw sum(w * x_r) = x_r, averaged over ranks
w = tf.Variable(np.zeros(4, np.float32))
x = np.arange(4, dtype=np.float32) * (R + 1)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(w * x)
grad = ddl.DistributedGradientTape(tape).gradient(loss, [w])[0]
close(grad, np.arange(4, dtype=np.float32) * np.mean(np.arange(1, N + 1)))

print(
    json.dumps(
        {
            "rank": R,
            "size": N,
            "local_rank": ddl.local_rank(),
            "local_size": ddl.local_size(),
            "hierarchical": ddl.hierarchical(),
        }
    ),
    flush=True,
)
print(f"rank={R} ok", flush=True)
sys.exit(0)
