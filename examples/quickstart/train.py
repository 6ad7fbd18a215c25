"""The quick start's training: synchronous data-parallel TensorFlow on every learner.

Each learner is one worker of a `tf.distribute.MultiWorkerMirroredStrategy`: the strategy
reads the cluster and this learner's place in it from `TF_CONFIG` (set by the platform),
starts the gRPC server itself, and all-reduces the gradients of every step across the
learners. The data is generated here (no download): noisy samples of
y = 3*x1 - 2*x2 + 0.5, a different shard per worker.

Worker 0 writes the SavedModel to $RESULT_DIR/model, signature `serving_default`:
`x` float32 [None, 2] -> `y` float32 [None, 1]; the platform stores it, and it can be
deployed and scored as it is. (Keras `fit` does not work under this strategy in
TensorFlow 2.21, hence the small custom loop; examples/mwms is the longer version.)

Flags: --steps (400), --global-batch-size (64), --learning-rate (0.05), --log-every (25).
Prints `worker=<i> step=<n> loss=<v>` (the loss averaged over all workers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

EXIT_GRACE = 3.0  # seconds worker 0 outlives the others


def log(message: str) -> None:
    print(message, flush=True)


def make_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(samples, 2)).astype(np.float32)
    noise = rng.normal(0.0, 0.02, size=(samples, 1)).astype(np.float32)
    return x, (3.0 * x[:, :1] - 2.0 * x[:, 1:] + 0.5 + noise).astype(np.float32)


class Regressor(tf.Module):
    """A 2-16-1 network; `serve` is what a deployment calls."""

    def __init__(self) -> None:
        super().__init__()
        init = tf.keras.initializers.GlorotUniform(seed=0)
        self.w1 = tf.Variable(init([2, 16]), name="w1")
        self.b1 = tf.Variable(tf.zeros([16]), name="b1")
        self.w2 = tf.Variable(init([16, 1]), name="w2")
        self.b2 = tf.Variable(tf.zeros([1]), name="b2")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.tanh(tf.matmul(x, self.w1) + self.b1), self.w2) + self.b2

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": self(x)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args(argv)

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    resolver = strategy.cluster_resolver
    worker = int(resolver.task_id or 0)
    chief = worker == 0  # the platform's TF_CONFIG has no "chief" job: worker 0 is it
    log(
        f"worker={worker} workers={strategy.num_replicas_in_sync} "
        f"learner={os.environ.get('LEARNER_ID', '1')} tensorflow={tf.__version__}"
    )

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        x, y = make_data(4096, seed=100 + context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(args.global_batch_size)
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=1).repeat()
        return data.batch(batch, drop_remainder=True)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = Regressor()
        optimizer = tf.keras.optimizers.Adam(args.learning_rate)

    @tf.function
    def train_step(iterator: tf.distribute.DistributedIterator) -> tf.Tensor:
        def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(x) - y), axis=1)
                loss = tf.nn.compute_average_loss(
                    per_example, global_batch_size=args.global_batch_size
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    @tf.function
    def barrier() -> tf.Tensor:
        ones = strategy.run(lambda: tf.constant(1.0))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)

    iterator = iter(dataset)
    started = time.monotonic()
    loss = float("nan")
    for step in range(1, args.steps + 1):
        loss = float(train_step(iterator))
        if step % args.log_every == 0 or step == args.steps:
            log(f"worker={worker} step={step} loss={loss:.6f}")
    seconds = time.monotonic() - started

    # Every worker takes part in saving (it may use collectives); only the chief keeps it.
    result_dir = Path(os.environ.get("RESULT_DIR") or "results")
    export_dir = result_dir / "model" if chief else Path(tempfile.mkdtemp(prefix="worker"))
    tf.saved_model.save(model, str(export_dir), signatures={"serving_default": model.serve})
    if chief:
        summary = {"loss": loss, "steps": args.steps, "seconds": round(seconds, 2)}
        (result_dir / "metrics.json").write_text(json.dumps(summary) + "\n")
        log(f"worker={worker} saved the SavedModel to {export_dir} ({seconds:.1f} s of training)")
    else:
        shutil.rmtree(export_dir, ignore_errors=True)
        log(f"worker={worker} done ({seconds:.1f} s of training)")
    # Worker 0 hosts TensorFlow's coordination service: the others leave first (after this
    # last all-reduce, a barrier), so that none of them loses it while shutting down.
    barrier()
    if chief and strategy.num_replicas_in_sync > 1:
        time.sleep(EXIT_GRACE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
