"""DDL's recipe, on MNIST-shaped generated data: a single-learner TensorFlow script plus
the few lines the DDL documentation names (each marked `# DDL:`).

For `tensorflow-ddl` jobs (the runtime `ddl-tf2.14`: the open `ddl` package over Horovod
0.28.1, TensorFlow 2.14.1, Open MPI 5). Learner 1 runs the command under `mpirun`, one rank
per GPU of every learner (one per learner on CPU).

Flags: --steps (default 60), --batch-size (64 per learner), --learning-rate (0.05 for one
learner; multiplied by ddl.size()), --seed (of the initial weights; rank 0's are broadcast).
The shards interleave (rank r takes samples r, r+n, ...), so n learners' step k averages the
gradient of the same samples as one learner's step k with n times the batch: with the same
--seed, `python train_ddl.py --batch-size 128 --learning-rate 0.1` on one learner follows
the 2-learner run's losses.
Prints: `rank=<r> size=<n> local_rank=<l> local_size=<m>` per rank, `step=<n> loss=<v>`
(rank 0, the loss averaged over every learner) every 10 steps, and on every rank
`rank=<r> checksum=<c>` (the sum of the trained variables: equal on every rank).
Writes (rank 0): $RESULT_DIR/model, a SavedModel whose serving signature takes `x`
(float32 [batch, 784]) and returns `y` (class probabilities [batch, 10]), and
$RESULT_DIR/ddl.json = {"size", "steps", "loss", "checksum"}.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import ddl  # DDL: initialises MPI and DDL, one GPU per learner
import numpy as np
import tensorflow as tf

SAMPLES = 8192


def dataset() -> tuple[np.ndarray, np.ndarray]:
    """MNIST-shaped data: 784 features in [0, 1], 10 classes, each a noisy copy of its
    class's template image (the same data on every learner: the seed is fixed)."""
    rng = np.random.default_rng(7)
    templates = (rng.random((10, 784)) < 0.2).astype(np.float32)
    y = rng.integers(0, 10, SAMPLES)
    noise = rng.normal(scale=0.5, size=(SAMPLES, 784)).astype(np.float32)
    x = np.clip(templates[y] + noise, 0.0, 1.0).astype(np.float32)
    return x, y.astype(np.int64)


class Classifier(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        # Unseeded: different on every learner until rank 0's are broadcast.
        self.w1 = tf.Variable(tf.random.normal([784, 64], stddev=0.05), name="w1")
        self.b1 = tf.Variable(tf.zeros([64]), name="b1")
        self.w2 = tf.Variable(tf.random.normal([64, 10], stddev=0.1), name="w2")
        self.b2 = tf.Variable(tf.zeros([10]), name="b2")

    def logits(self, x: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(x @ self.w1 + self.b1) @ self.w2 + self.b2

    @tf.function(input_signature=[tf.TensorSpec([None, 784], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.nn.softmax(self.logits(x))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=None, help="of the initial weights")
    args = parser.parse_args()
    print(
        f"rank={ddl.rank()} size={ddl.size()} "
        f"local_rank={ddl.local_rank()} local_size={ddl.local_size()}",
        flush=True,
    )

    x, y = dataset()
    # DDL: statistically orthogonal partitions, one per learner, by ddl.rank().
    x, y = x[ddl.rank() :: ddl.size()], y[ddl.rank() :: ddl.size()]
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)

    if args.seed is not None:
        tf.random.set_seed(args.seed)
    model = Classifier()
    # DDL: the global batch grows with the learners, so does the learning rate.
    opt = tf.keras.optimizers.SGD(args.learning_rate * ddl.size())
    # DDL: every learner starts from rank 0's weights and biases.
    ddl.broadcast_variables(model.trainable_variables)

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(yb, model.logits(xb))
            )
        tape = ddl.DistributedGradientTape(tape)  # DDL: gradients averaged, all_reduce_n
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    loss = 0.0
    for n, (xb, yb) in enumerate(data.take(args.steps)):
        local = step(xb, yb)
        loss = float(ddl.all_reduce_n([local], op="avg")[0])
        if ddl.rank() == 0 and (n % 10 == 0 or n == args.steps - 1):
            print(f"step={n} loss={loss:.6f}", flush=True)

    checksum = float(sum(float(tf.reduce_sum(v)) for v in model.trainable_variables))
    print(f"rank={ddl.rank()} checksum={checksum:.10f}", flush=True)
    if ddl.rank() == 0:
        result_dir = Path(os.environ.get("RESULT_DIR", "results"))
        result_dir.mkdir(parents=True, exist_ok=True)
        # Only rank 0 saves; the SavedModel holds no DDL op (the gradient tape is not in
        # the serving function), so it serves anywhere TensorFlow does.
        tf.saved_model.save(
            model, str(result_dir / "model"), signatures={"serving_default": model.serve}
        )
        report = {"size": ddl.size(), "steps": args.steps, "loss": loss, "checksum": checksum}
        (result_dir / "ddl.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
