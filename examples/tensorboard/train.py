"""A small TensorFlow training that writes its metrics as TensorBoard scalars (`tf.summary`).

Fits y = 2*x - 1 with one weight and one bias by gradient descent, on data generated here,
and writes the loss and the weight at every step to event files under $LOG_DIR/train (the
metrics `train/loss` and `train/weight` of a manifest whose `evaluation_metrics` are
`{type: tensorboard}`; TensorBoard's run `learner-<i>/train` in `dlaas tensorboard`).

Needs: LOG_DIR (defaults to ./logs when unset).  Flags: --steps (default 20),
--step-seconds (pause after each step, default 0), --linger (seconds to stay running after
the last step, default 0: for watching a running training's metrics).
Prints: ``step=<n> loss=<v>`` per step, then ``done steps=<n>``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args(argv)

    log_dir = Path(os.environ.get("LOG_DIR", "logs")) / "train"
    writer = tf.summary.create_file_writer(str(log_dir))
    x = tf.random.stateless_uniform([256, 1], seed=(1, 2), minval=-1.0, maxval=1.0)
    y = 2.0 * x - 1.0
    weight = tf.Variable(0.0)
    bias = tf.Variable(0.0)
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.2)
    for step in range(args.steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(weight * x + bias - y))
        variables = [weight, bias]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        with writer.as_default():
            tf.summary.scalar("loss", loss, step=step)
            tf.summary.scalar("weight", weight, step=step)
        writer.flush()  # on disk now, for the platform to read while the training runs
        print(f"step={step} loss={float(loss):.6f}", flush=True)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    writer.close()
    print(f"done steps={args.steps}", flush=True)
    if args.linger:
        time.sleep(args.linger)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
