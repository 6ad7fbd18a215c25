"""Synchronous data-parallel training with tf.distribute.MultiWorkerMirroredStrategy.

Every learner is one worker (no parameter servers: ``PS_HOSTS_COUNT=0``).  The strategy reads
the cluster and this learner's task from ``TF_CONFIG``, starts the gRPC server itself and
all-reduces gradients with the CPU ring collective implementation.  Keras 3 ``fit`` does not
work under this strategy in TensorFlow 2.21, so the loop is a custom one with ``strategy.run``.

Needs: TF_CONFIG (the platform's, with no "ps" job; without it: one local worker), RESULT_DIR.
Flags: --steps (default 100), --global-batch-size (default 64), --learning-rate (0.05),
--log-every (10).
Prints: ``worker=<i> workers=<n> ...`` once, ``worker=<i> step=<n> loss=<v>`` every --log-every
steps and after the last one (the loss is the global mean over all workers, so every worker
prints the same values), ``worker=<i> saved=<dir>`` at the end.
Writes: worker 0 -> $RESULT_DIR/model (SavedModel; ``serving_default``: ``x`` float32 [None, 2]
-> ``y`` float32 [None, 1]) and $RESULT_DIR/metrics.json.  Every worker must take part in the
save (it may use collectives), so the others save to a temporary directory and delete it.
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

HIDDEN = 16


def log(message: str) -> None:
    print(message, flush=True)


def make_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(samples, 2)).astype(np.float32)
    noise = rng.normal(0.0, 0.05, size=(samples, 1)).astype(np.float32)
    return x, (3.0 * x[:, :1] - 2.0 * x[:, 1:] + 0.5 + noise).astype(np.float32)


class Regressor(tf.Module):
    """A 2-16-1 tanh network as a plain tf.Module (variables mirrored by the strategy)."""

    def __init__(self) -> None:
        super().__init__()
        init = tf.keras.initializers.GlorotUniform(seed=0)
        self.w1 = tf.Variable(init([2, HIDDEN]), name="w1")
        self.b1 = tf.Variable(tf.zeros([HIDDEN]), name="b1")
        self.w2 = tf.Variable(init([HIDDEN, 1]), name="w2")
        self.b2 = tf.Variable(tf.zeros([1]), name="b2")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.tanh(tf.matmul(x, self.w1) + self.b1), self.w2) + self.b2

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": self(x)}


def task_of(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> tuple[str, int]:
    task_type = resolver.task_type or "worker"
    return task_type, int(resolver.task_id or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=2048, help="examples per worker")
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args(argv)

    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if config.get("cluster", {}).get("ps"):
        log("error=this example needs parameter_servers: 0 (TF_CONFIG has a ps job)")
        return 2
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    task_type, task_id = task_of(strategy.cluster_resolver)
    workers = strategy.num_replicas_in_sync
    # The platform's TF_CONFIG has no "chief" job: worker 0 is the chief.
    has_chief = bool(config.get("cluster", {}).get("chief"))
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)
    log(
        f"worker={task_id} workers={workers} task_type={task_type} chief={is_chief}"
        f" learner={os.environ.get('LEARNER_ID', '1')} tensorflow={tf.__version__}"
    )

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        x, y = make_data(args.samples, seed=100 + context.input_pipeline_id)
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

    iterator = iter(dataset)
    started = time.monotonic()
    loss = float("nan")
    for step in range(1, args.steps + 1):
        loss = float(train_step(iterator))
        if step % args.log_every == 0 or step == args.steps:
            log(f"worker={task_id} step={step} loss={loss:.6f}")
    seconds = time.monotonic() - started

    result_dir = Path(os.environ.get("RESULT_DIR") or "results")
    if is_chief:
        export_dir = result_dir / "model"
        export_dir.parent.mkdir(parents=True, exist_ok=True)
    else:
        export_dir = Path(tempfile.mkdtemp(prefix=f"mwms-worker{task_id}-"))
    tf.saved_model.save(model, str(export_dir), signatures={"serving_default": model.serve})
    if is_chief:
        metrics = {"loss": loss, "steps": args.steps, "workers": workers, "seconds": seconds}
        (result_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        log(f"worker={task_id} saved={export_dir} train_seconds={seconds:.2f}")
    else:
        shutil.rmtree(export_dir, ignore_errors=True)
        log(f"worker={task_id} saved=temporary (deleted) train_seconds={seconds:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
