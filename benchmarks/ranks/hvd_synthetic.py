"""A synthetic Horovod benchmark: a Keras application model on random images, trained with
Horovod's DistributedGradientTape, measured in images per second per iteration.

    mpirun -np 2 python hvd_synthetic.py [--model MobileNet] [--batch-size 8] ...

Each rank trains the same model on its own random batch (nothing is read from disk):
warm-up batches first (graph tracing, the first allreduces), then `--iterations`
timed iterations of `--batches` batches each. Rank 0 prints one line,
`hvd_synthetic {json}`: images/s of every iteration summed over the ranks, their mean and
the ranks. Run alone by benchmarks/hvd_synthetic.py, through the platform and by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="MobileNet")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.25, help="MobileNet's width")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup-batches", type=int, default=3)
    parser.add_argument("--batches", type=int, default=5, help="batches per iteration")
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())
    shape = (args.image_size, args.image_size, 3)
    build = getattr(tf.keras.applications, args.model)
    options = {"alpha": args.alpha} if args.model.startswith("MobileNet") else {}
    model = build(weights=None, input_shape=shape, classes=100, **options)
    optimizer = tf.keras.optimizers.SGD(0.01)
    images = tf.random.uniform((args.batch_size, *shape))
    labels = tf.random.uniform((args.batch_size, 1), maxval=100, dtype=tf.int64)
    loss_of = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step(first: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_of(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        if first:  # every rank starts from rank 0's weights
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)

    step(True)
    for _ in range(args.warmup_batches):
        step(False)
    rates = []
    for _ in range(args.iterations):
        started = time.perf_counter()
        for _ in range(args.batches):
            step(False)
        elapsed = time.perf_counter() - started
        rates.append(args.batch_size * args.batches * hvd.size() / elapsed)
    if hvd.rank() == 0:
        result = {"images_per_s": rates, "mean": sum(rates) / len(rates), "ranks": hvd.size()}
        print("hvd_synthetic", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
