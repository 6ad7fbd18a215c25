"""A servable SavedModel from a training whose graph holds ops that cannot be saved.

The procedure the IBM DDL documentation gives for DDL (and that Horovod needs too), in
TensorFlow 1 graph style (``tf.compat.v1``):

1. Build the *base graph* first - input placeholder to output, every tensor named - and
   write it with ``tf.train.export_meta_graph`` before anything else is added or run.
2. Add what training needs (loss, optimizer, and the distribution ops: DDL's broadcast and
   AllReduceN, Horovod's allreduce), train, and write checkpoints with ``tf.train.Saver``.
   The checkpoint's own meta graph holds those ops and may not load anywhere else.
3. In a fresh graph, ``tf.train.import_meta_graph`` the base graph, ``restore`` the trained
   weights into it, and save that session with the SavedModel builder under a
   ``serving_default`` signature.

Here the distribution op is gradient averaging across MPI ranks through
``tf.numpy_function`` (mpi4py's Allreduce when the script runs under ``mpirun``, the
identity alone). Like DDL's and Horovod's custom ops, a numpy_function cannot be saved in a
SavedModel, which is why the procedure above is needed. The model learns
y = 3*x1 - 2*x2 + 0.5.

Needs: RESULT_DIR (default ./results); mpi4py only under mpirun. Flags: --steps (300).
Prints: ``rank=<r> size=<n>``, ``step=<n> loss=<v>`` every 50 steps, ``saved=<dir>``.
Writes (rank 0): $RESULT_DIR/model - SavedModel, signature ``serving_default``: input ``x``
float32 [None, 2], output ``y`` float32 [None, 1].
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def mpi() -> tuple[object | None, int, int]:
    """The MPI communicator, rank and size; (None, 0, 1) outside an MPI launch."""
    if not any(k.startswith(("OMPI_", "PMI_", "PMIX_")) for k in os.environ):
        return None, 0, 1
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


def build_base_graph() -> tuple[tf.Tensor, tf.Tensor]:
    """Step 1's graph: the model alone, from the input placeholder to the output."""
    x = v1.placeholder(tf.float32, [None, 2], name="x")
    init = v1.glorot_uniform_initializer(seed=0)
    w1 = v1.get_variable("w1", [2, 16], initializer=init)
    b1 = v1.get_variable("b1", [16], initializer=v1.zeros_initializer())
    w2 = v1.get_variable("w2", [16, 1], initializer=init)
    b2 = v1.get_variable("b2", [1], initializer=v1.zeros_initializer())
    hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    y = tf.identity(tf.matmul(hidden, w2) + b2, name="y")
    return x, y


def train(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """Steps 1 and 2: export the base graph, then train; the base meta graph and the last
    checkpoint."""
    comm, rank, size = mpi()
    print(f"rank={rank} size={size}", flush=True)
    graph = tf.Graph()
    with graph.as_default():
        x, y = build_base_graph()
        base = work / "base.meta"
        v1.train.export_meta_graph(filename=str(base))  # before any training op exists

        # One collective for every tensor at once (DDL's AllReduceN): MPI calls must come
        # in the same order on every rank, and TensorFlow runs independent ops in parallel.
        def allreduce_mean(*values: np.ndarray) -> list[np.ndarray]:
            if comm is None:
                return list(values)
            flat = np.concatenate([v.ravel() for v in values])
            total = np.empty_like(flat)
            comm.Allreduce(flat, total)
            parts = np.split(total / size, np.cumsum([v.size for v in values])[:-1])
            return [p.reshape(v.shape).astype(v.dtype) for p, v in zip(parts, values, strict=True)]

        def from_rank0(*values: np.ndarray) -> list[np.ndarray]:
            if comm is None:
                return list(values)
            return list(comm.bcast(list(values), root=0))

        y_true = v1.placeholder(tf.float32, [None, 1], name="y_true")
        loss = tf.reduce_mean(tf.square(y - y_true))
        optimizer = v1.train.AdamOptimizer(0.05)
        grads, variables = zip(*optimizer.compute_gradients(loss), strict=True)
        # The training-only op: a numpy_function cannot be saved, like DDL's and Horovod's.
        averaged = tf.numpy_function(allreduce_mean, list(grads), [tf.float32] * len(grads))
        for a, g in zip(averaged, grads, strict=True):
            a.set_shape(g.shape)
        train_op = optimizer.apply_gradients(zip(averaged, variables, strict=True))
        initial = tf.numpy_function(from_rank0, list(variables), [tf.float32] * len(variables))
        broadcast = [
            v.assign(tf.reshape(i, v.shape)) for v, i in zip(variables, initial, strict=True)
        ]
        saver = v1.train.Saver()

        rng = np.random.default_rng(rank)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(broadcast)  # every rank starts from rank 0's weights
            for step in range(1, args.steps + 1):
                xs = rng.uniform(-1, 1, size=(64, 2)).astype(np.float32)
                ys = (3 * xs[:, :1] - 2 * xs[:, 1:] + 0.5).astype(np.float32)
                _, value = sess.run([train_op, loss], {x: xs, y_true: ys})
                if step % 50 == 0 and rank == 0:
                    print(f"step={step} loss={value:.6f}", flush=True)
            checkpoint = Path(saver.save(sess, str(work / "model.ckpt"), global_step=args.steps))
    return base, checkpoint


def export(base: Path, checkpoint: Path, export_dir: Path) -> None:
    """Step 3: the base graph with the trained weights, saved with the SavedModel builder."""
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        restorer = v1.train.import_meta_graph(str(base))
        restorer.restore(sess, str(checkpoint))
        x = graph.get_tensor_by_name("x:0")
        y = graph.get_tensor_by_name("y:0")
        if export_dir.exists():
            shutil.rmtree(export_dir)
        builder = v1.saved_model.Builder(str(export_dir))
        builder.add_meta_graph_and_variables(
            sess,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map={
                "serving_default": v1.saved_model.predict_signature_def(
                    inputs={"x": x}, outputs={"y": y}
                )
            },
        )
        builder.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    v1.disable_eager_execution()
    result_dir = Path(os.environ.get("RESULT_DIR") or "results")
    with tempfile.TemporaryDirectory() as tmp:
        base, checkpoint = train(args, Path(tmp))
        if mpi()[1] == 0:
            export(base, checkpoint, result_dir / "model")
            print(f"saved={result_dir / 'model'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
