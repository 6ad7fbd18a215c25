"""Single-learner Keras training that exports a servable TensorFlow SavedModel.

Learns y = 3*x1 - 2*x2 + 0.5 (+ noise) with a small dense network on data generated here.

Needs: RESULT_DIR (defaults to ./results when unset).  Flags: --epochs (default 5),
--batch-size (default 32), --samples (default 2048).
Prints: one ``epoch=<e> loss=<v>`` line per epoch, then ``step=<n> loss=<v>`` for the final
evaluation and ``saved=<path>``.
Writes: $RESULT_DIR/model (SavedModel; signature ``serving_default`` takes ``x``: float32
[None, 2] and returns ``y``: float32 [None, 1]) and $RESULT_DIR/metrics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf


def log(message: str) -> None:
    print(message, flush=True)


def make_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(samples, 2)).astype(np.float32)
    noise = rng.normal(0.0, 0.05, size=(samples, 1)).astype(np.float32)
    y = (3.0 * x[:, :1] - 2.0 * x[:, 1:] + 0.5 + noise).astype(np.float32)
    return x, y


class Exported(tf.Module):
    """What goes into the SavedModel: the trained Keras model behind a named signature."""

    def __init__(self, model: tf.keras.Model) -> None:
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": self.model(x, training=False)}


class EpochLog(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        log(f"epoch={epoch + 1} loss={(logs or {}).get('loss', float('nan')):.6f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args(argv)

    result_dir = Path(os.environ.get("RESULT_DIR") or "results")
    result_dir.mkdir(parents=True, exist_ok=True)
    log(
        f"training_id={os.environ.get('TRAINING_ID', '')}"
        f" learner={os.environ.get('LEARNER_ID', '1')}"
        f" tensorflow={tf.__version__} epochs={args.epochs}"
    )

    tf.keras.utils.set_random_seed(0)
    x, y = make_data(args.samples)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(2,), name="x"),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="mse")
    started = time.monotonic()
    model.fit(
        x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=0, callbacks=[EpochLog()]
    )
    loss = float(model.evaluate(x, y, verbose=0))
    steps = args.epochs * -(-args.samples // args.batch_size)
    log(f"step={steps} loss={loss:.6f}")

    export_dir = result_dir / "model"
    module = Exported(model)
    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": module.serve})
    log(f"saved={export_dir}")

    metrics = {
        "loss": loss,
        "epochs": args.epochs,
        "steps": steps,
        "train_seconds": round(time.monotonic() - started, 3),
    }
    (result_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
