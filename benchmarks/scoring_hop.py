"""The model process's hop alone: a keras-single-sized SavedModel (2-16-1) called through
the scoring service's transport (batcher, model process in its sandbox, the wire format)
from an asyncio loop, against the same SavedModel called back to back in this process.

    python benchmarks/scoring_hop.py [--batch 64] [--concurrency 4] [--seconds 2]

No HTTP, no gRPC, no database: what a call costs between `ScoringService._call` and the
model. For profiling (py-spy record -- python benchmarks/scoring_hop.py) and for short
comparisons while changing `service/scoring/process.py`, `model_server.py`, `batching.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median, percentile


def save_model(path: Path) -> None:
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(16, activation="relu"),
         tf.keras.layers.Dense(1)]
    )  # fmt: skip

    class Exported(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": self.model(x, training=False)}

    module = Exported()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def in_process(model_dir: Path, batch: np.ndarray, seconds: float) -> tuple[float, list[float]]:
    import tensorflow as tf

    function = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    for _ in range(10):
        function(x=tf.constant(batch))["y"].numpy()
    latencies = []
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        function(x=tf.constant(batch))["y"].numpy()
        latencies.append(time.perf_counter() - now)
    return len(latencies) * len(batch) / (time.perf_counter() - start), latencies


async def served(
    model: Any, batch: np.ndarray, concurrency: int, seconds: float
) -> tuple[float, list[float]]:
    """`concurrency` callers on this loop, each submitting its next call when answered."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def caller() -> None:
        while (now := time.perf_counter()) < stop:
            with model.arrivals.coming() as arrived:
                future = model.submit("serving_default", {"x": batch}, len(batch))
                arrived()
            await asyncio.wrap_future(future) if not asyncio.isfuture(future) else await future
            latencies.append(time.perf_counter() - now)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return len(latencies) * len(batch) / (time.perf_counter() - start), latencies


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes of process group `pgid`."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = (Path("/proc") / entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # pgrp, then utime and stime at 11 and 12
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--served-only", action="store_true", help="no in-process baseline")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import uvloop

    from service.scoring.batching import Arrivals
    from service.scoring.cache import BatchingConfig, ServedModel
    from service.scoring.process import ProcessConfig
    from service.settings import Settings

    try:
        from service.scoring.supervised import SupervisedModel
    except ImportError:  # the code before the model process's supervision had a module
        from service.scoring.process import SupervisedModel  # type: ignore[attr-defined,no-redef]

    batch = np.random.default_rng(0).uniform(-1, 1, size=(args.batch, 2)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="dlaas-hop-") as tmp:
        model_dir = Path(tmp) / "model"
        save_model(model_dir)
        # The service's defaults: batches of up to DLAAS_SCORING_MAX_BATCH_SIZE rows, one
        # connection and one batching thread (Settings.resolved_scoring_threads).
        defaults = Settings()
        threads = defaults.resolved_scoring_threads
        supervised = SupervisedModel(
            "hop", model_dir, ProcessConfig(connections=threads, call_timeout=30,
                                            allow_unsandboxed=True), lambda *_: None
        )  # fmt: skip
        supervised.start()
        batching = BatchingConfig(
            True, defaults.scoring_max_batch_size, defaults.scoring_max_wait_ms / 1000, threads
        )
        model = ServedModel(supervised, batching, "hop", Arrivals())
        try:
            base, ours = [], []
            cpu_here, cpu_model, calls = 0.0, 0.0, 0
            popen = supervised._process._popen  # type: ignore[union-attr]
            for _ in range(args.repeats):
                if not args.served_only:
                    base.append(in_process(model_dir, batch, args.seconds))
                here, there = time.process_time(), group_cpu(popen.pid)
                ours.append(uvloop.run(served(model, batch, args.concurrency, args.seconds)))
                cpu_here += time.process_time() - here
                cpu_model += group_cpu(popen.pid) - there
                calls += len(ours[-1][1])
            print(
                f"CPU per call: {cpu_here / calls * 1e6:.0f} us here, "
                f"{cpu_model / calls * 1e6:.0f} us in the model process ({calls} calls)"
            )
            for name, samples in (("in-process", base), ("served", ours)):
                if samples:
                    rate = median([s[0] for s in samples])
                    p50 = median([percentile(s[1], 50) for s in samples]) * 1000
                    print(f"{name}: {rate:,.0f} predictions/s, p50 {p50:.3f} ms")
            if base:
                ratio = median([o[0] / b[0] for o, b in zip(ours, base, strict=True)])
                print(f"ratio {ratio:.2f}")
        finally:
            model.close()


if __name__ == "__main__":
    main()
