"""Horovod with TensorFlow 2, as Horovod's own TF2 examples are written.

For `tensorflow-horovod` jobs (the runtime `horovod-tf2.14`: TensorFlow 2.14.1, Horovod
0.28.1, Open MPI 5). Learner 1 runs the command under `mpirun`, one rank per GPU of every
learner (one per learner on CPU): `hvd.init()`, each rank trains a small Keras model on its
own shard of generated data, gradients are averaged by `hvd.DistributedGradientTape`, the
initial variables are broadcast from rank 0 after the first step (`hvd.broadcast_variables`,
as the examples do, once the optimizer's slots exist), and rank 0 writes the checkpoints.

Flags: --steps (default 30), --batch-size (32 per rank), --learning-rate (0.05, scaled by
the number of ranks as Horovod recommends).
Prints: `rank=<r> size=<n> host=<hostname>` per rank, `step=<n> loss=<v>` (rank 0) every 10
steps, and at the end, on every rank, `rank=<r> checksum=<c>`: the sum of every trained
variable, identical on all ranks when they trained in lockstep.
Writes (rank 0): checkpoints in $CHECKPOINT_DIR (./checkpoints when unset),
$RESULT_DIR/horovod.json = {"size", "steps", "loss", "checksum"}, and $RESULT_DIR/model, a
SavedModel whose `serving_default` signature takes `x` (float32, [None, 4]) and returns `y`
(the prediction). It deploys as it is: the serving function calls the trained model alone,
never Horovod's ops (the README's "Export a SavedModel from a distributed training").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

TRUE_W = np.array([[2.0], [-3.0], [0.5], [1.0]], dtype=np.float32)


def shard(rank: int, samples: int) -> tf.data.Dataset:
    """This rank's own data: y = x.W + 1 with a little noise, different on every rank."""
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(samples, 4)).astype(np.float32)
    y = x @ TRUE_W + 1.0 + rng.normal(scale=0.01, size=(samples, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y))


class Serving(tf.Module):
    """What rank 0 exports: the trained model behind a serving signature, and nothing of
    the training (no Horovod op, no optimizer), so it serves wherever TensorFlow does."""

    def __init__(self, model: tf.keras.Model) -> None:
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": self.model(x, training=False)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    print(f"rank={hvd.rank()} size={hvd.size()} host={socket.gethostname()}", flush=True)
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    data = shard(hvd.rank(), args.steps * args.batch_size).repeat().batch(args.batch_size)
    model = tf.keras.Sequential(
        [tf.keras.layers.Dense(8, activation="tanh"), tf.keras.layers.Dense(1)]
    )
    loss_fn = tf.keras.losses.MeanSquaredError()
    # Horovod: scale the learning rate by the number of workers.
    opt = tf.optimizers.SGD(args.learning_rate * hvd.size())
    checkpoint_dir = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)

    @tf.function
    def training_step(x: tf.Tensor, y: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # Horovod: average the gradients of every rank.
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        # Horovod: broadcast the initial variables from rank 0 to every rank, after the
        # first step so that the optimizer's variables exist too.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss

    loss = tf.constant(0.0)
    for step, (x, y) in enumerate(data.take(args.steps)):
        loss = training_step(x, y, step == 0)
        mean_loss = float(hvd.allreduce(loss, op=hvd.Average))
        if hvd.rank() == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step={step} loss={mean_loss:.6f}", flush=True)
            # Horovod: only rank 0 saves checkpoints, so the others cannot corrupt them.
            checkpoint.save(str(checkpoint_dir / "ckpt"))

    checksum = float(sum(float(tf.reduce_sum(v)) for v in model.trainable_variables))
    print(f"rank={hvd.rank()} checksum={checksum:.10f}", flush=True)
    if hvd.rank() == 0:
        result_dir = Path(os.environ.get("RESULT_DIR", "results"))
        result_dir.mkdir(parents=True, exist_ok=True)
        report = {
            "size": hvd.size(),
            "steps": args.steps,
            "loss": float(hvd.allreduce(loss, op=hvd.Average)),
            "checksum": checksum,
        }
        (result_dir / "horovod.json").write_text(json.dumps(report))
        # Horovod: only rank 0 exports the model.
        serving = Serving(model)
        tf.saved_model.save(
            serving, str(result_dir / "model"), signatures={"serving_default": serving.serve}
        )
    else:
        hvd.allreduce(loss, op=hvd.Average)  # the collective rank 0's report takes part in


if __name__ == "__main__":
    main()
