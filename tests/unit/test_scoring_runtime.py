"""The scoring runtime without TensorFlow: dynamic batching, rate limits, signatures kept as
JSON, and the rule of what can be deployed."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from service.domain.catalog import DEFAULT_CATALOG
from service.domain.deployments import EXPORT_GUIDE, check_deployable
from service.domain.signature import (
    SignatureInfo,
    TensorInfo,
    signatures_from_json,
    signatures_to_json,
)
from service.errors import Conflict, ValidationFailed
from service.scoring.batching import (
    Arrivals,
    DirectRunner,
    DynamicBatcher,
    ModelUnloaded,
    Tensors,
)
from service.scoring.ratelimit import InProcessRateLimiter, RedisRateLimiter


class Doubler:
    """A model: y = 2x, remembering the batch size of every call."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, tensors: Tensors) -> dict[str, np.ndarray]:
        with self.lock:
            self.calls.append(len(tensors["x"]))
        return {"y": tensors["x"] * 2}


def rows(start: int, n: int, width: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.arange(start, start + n * width, dtype=np.float32).reshape(n, width)}


@pytest.fixture
def model() -> Doubler:
    return Doubler()


@pytest.fixture
def batcher(model: Doubler) -> Iterator[DynamicBatcher]:
    b = DynamicBatcher(model, max_batch_size=8, max_wait=0.2, threads=1)
    yield b
    b.close()


def test_requests_waiting_together_share_one_call(model: Doubler, batcher: DynamicBatcher) -> None:
    futures = [batcher.submit(rows(10 * i, 2), 2) for i in range(3)]
    for i, f in enumerate(futures):
        np.testing.assert_array_equal(f.result(timeout=5)["y"], rows(10 * i, 2)["x"] * 2)
    assert model.calls == [6]


def test_batches_never_exceed_the_maximum(model: Doubler, batcher: DynamicBatcher) -> None:
    futures = [batcher.submit(rows(0, 3), 3) for _ in range(4)]
    for f in futures:
        assert f.result(timeout=5)["y"].shape == (3, 2)
    assert model.calls == [6, 6]


def test_a_request_above_the_maximum_runs_alone(model: Doubler, batcher: DynamicBatcher) -> None:
    assert batcher.submit(rows(0, 20), 20).result(timeout=5)["y"].shape == (20, 2)
    assert model.calls == [20]


def test_instances_of_different_shapes_are_not_merged(
    model: Doubler, batcher: DynamicBatcher
) -> None:
    a = batcher.submit(rows(0, 1, width=2), 1)
    b = batcher.submit(rows(0, 1, width=3), 1)
    assert a.result(timeout=5)["y"].shape == (1, 2)
    assert b.result(timeout=5)["y"].shape == (1, 3)
    assert model.calls == [1, 1]


def test_a_failing_call_fails_every_request_of_the_batch() -> None:
    def broken(tensors: Tensors) -> dict[str, np.ndarray]:
        raise ValueError("model says no")

    b = DynamicBatcher(broken, max_batch_size=8, max_wait=0.1)
    futures = [b.submit(rows(0, 1), 1) for _ in range(3)]
    for f in futures:
        with pytest.raises(ValueError, match="model says no"):
            f.result(timeout=5)
    b.close()


def test_outputs_without_one_row_per_instance_are_an_error() -> None:
    b = DynamicBatcher(lambda t: {"y": np.zeros((1,))}, max_batch_size=8, max_wait=0.1)
    futures = [b.submit(rows(0, 1), 1) for _ in range(2)]
    for f in futures:
        with pytest.raises(ValueError, match="1 rows for 2 instances"):
            f.result(timeout=5)
    b.close()


def test_with_arrivals_a_lone_request_does_not_wait(model: Doubler) -> None:
    arrivals = Arrivals()
    b = DynamicBatcher(model, max_batch_size=8, max_wait=5.0, arrivals=arrivals)
    started = time.monotonic()
    with arrivals.coming() as arrived:
        future = b.submit(rows(0, 1), 1)
        arrived()
        future.result(timeout=5)
    assert time.monotonic() - started < 1.0
    assert arrivals.pending == 0
    b.close()


def test_with_arrivals_a_batch_waits_for_announced_requests(model: Doubler) -> None:
    arrivals = Arrivals()
    b = DynamicBatcher(model, max_batch_size=8, max_wait=5.0, arrivals=arrivals)
    with arrivals.coming() as first_arrived, arrivals.coming() as second_arrived:
        first = b.submit(rows(0, 1), 1)
        first_arrived()
        time.sleep(0.1)  # the batch is held open for the second, still on its way
        assert not first.done()
        second = b.submit(rows(0, 1), 1)
        second_arrived()
        first.result(timeout=5), second.result(timeout=5)
    assert model.calls == [2]
    b.close()


def test_closing_finishes_what_was_submitted_and_refuses_more(model: Doubler) -> None:
    gate = threading.Event()

    def slow(tensors: Tensors) -> dict[str, np.ndarray]:
        gate.wait(5)
        return {"y": tensors["x"]}

    b = DynamicBatcher(slow, max_batch_size=1, max_wait=0.0)
    running = b.submit(rows(0, 1), 1)
    time.sleep(0.05)
    queued = b.submit(rows(0, 1), 1)
    b.close()
    gate.set()
    assert running.result(timeout=5)["y"].shape == (1, 2)
    assert queued.result(timeout=5)["y"].shape == (1, 2)
    with pytest.raises(ModelUnloaded):
        b.submit(rows(0, 1), 1)


def test_direct_runner_calls_once_per_request(model: Doubler) -> None:
    runner = DirectRunner(model, threads=2)
    futures = [runner.submit(rows(0, 1), 1) for _ in range(3)]
    assert all(f.result(timeout=5)["y"].shape == (1, 2) for f in futures)
    assert model.calls == [1, 1, 1]
    runner.close()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_in_process_rate_limit_counts_instances_per_minute() -> None:
    clock = Clock(600.0)  # the start of a minute
    limiter = InProcessRateLimiter(clock)

    async def run() -> None:
        assert (await limiter.acquire("t", 10, 6)).remaining == 4
        clock.now = 615.2
        refused = await limiter.acquire("t", 10, 5)
        assert not refused.allowed and refused.retry_after == 45 and refused.remaining == 4
        assert (await limiter.acquire("t", 10, 4)).allowed  # refusals used nothing
        assert (await limiter.acquire("other", 10, 10)).allowed  # per tenant
        clock.now = 660.0
        assert (await limiter.acquire("t", 10, 10)).allowed  # a new window

    asyncio.run(run())


@pytest.mark.integration
def test_redis_rate_limit_is_shared_between_limiters() -> None:
    prefix = f"dlaas:test:{uuid.uuid4().hex}"
    clock = Clock(1200.0)

    async def run() -> None:
        first = RedisRateLimiter("redis://127.0.0.1:6379/0", prefix=prefix, clock=clock)
        second = RedisRateLimiter("redis://127.0.0.1:6379/0", prefix=prefix, clock=clock)
        try:
            assert (await first.acquire("t", 10, 7)).remaining == 3
            clock.now = 1230.0
            refused = await second.acquire("t", 10, 4)
            assert not refused.allowed and refused.retry_after == 30
            assert (await second.acquire("t", 10, 3)).remaining == 0
            clock.now = 1260.0
            assert (await first.acquire("t", 10, 10)).allowed
        finally:
            await first.close()
            await second.close()

    asyncio.run(run())


def test_signatures_survive_json() -> None:
    signatures = {
        "serving_default": SignatureInfo(
            "serving_default",
            {"x": TensorInfo("x", "float32", (None, 2))},
            {"y": TensorInfo("y", "float32", (None, None)), "u": TensorInfo("u", "string", None)},
        )
    }
    again = signatures_from_json(signatures_to_json(signatures))
    assert again == signatures
    assert not again["serving_default"].batchable  # u has no known batch dimension
    assert again["serving_default"].inputs["x"].describe() == "float32 [None, 2]"


@pytest.mark.parametrize(
    ("status", "framework", "has_model", "has_onnx", "error"),
    [
        ("COMPLETED", "tensorflow", True, False, None),
        ("COMPLETED", "tensorflow-horovod", True, False, None),
        ("RUNNING", "tensorflow", True, False, Conflict),
        ("FAILED", "tensorflow", True, False, Conflict),
        ("COMPLETED", "tensorflow", False, False, ValidationFailed),
        ("COMPLETED", "pytorch", True, False, ValidationFailed),
        # An ONNX model is served whatever the framework that trained it.
        ("COMPLETED", "pytorch", False, True, None),
        ("COMPLETED", "pytorch", True, True, None),
        ("COMPLETED", "tensorflow", False, True, None),
        ("RUNNING", "pytorch", False, True, Conflict),
        ("COMPLETED", "pytorch", False, False, ValidationFailed),
    ],
)
def test_what_can_be_deployed(
    status: str, framework: str, has_model: bool, has_onnx: bool, error: type[Exception] | None
) -> None:
    native = DEFAULT_CATALOG.native_tensorflow(framework)

    def check() -> None:
        check_deployable(
            "t1", status, framework, has_model, native_tensorflow=native, has_onnx_model=has_onnx
        )

    if error is None:
        check()
        return
    with pytest.raises(error) as e:
        check()
    assert "online deployment (scoring) takes a COMPLETED training" in str(e.value)
    assert EXPORT_GUIDE in str(e.value) and "README.md#deploy-an-onnx-model" in str(e.value)
    if error is ValidationFailed and framework == "pytorch" and has_model:
        assert "export model/model.onnx instead" in str(e.value)
