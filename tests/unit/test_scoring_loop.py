"""Batches made on the event loop (loop_batching.LoopBatcher) against a fake model whose calls
the test ends, and the event loop's model call (process.ModelProcess.start_call) against
a socket the test answers: no thread between a request and the model process."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from service.domain.signature import SignatureInfo, TensorInfo
from service.scoring import model_wire
from service.scoring.batch_sizes import BatchSizes
from service.scoring.batching import Arrivals, ModelUnloaded, Tensors
from service.scoring.loop_batching import LoopBatcher
from service.scoring.model_wire import (
    Closed,
    FrameReader,
    WireError,
    encode_call,
    encode_error,
    encode_result,
    receive,
    send,
    tensors_of,
)
from service.scoring.process_messages import answer_limits

Outputs = dict[str, np.ndarray]


class LoopModel:
    """A model called on the loop: each call waits until the test answers it; at most
    `connections` at once (start returns None beyond)."""

    def __init__(self, connections: int = 2) -> None:
        self.connections = connections
        self.calls: list[tuple[int, asyncio.Future[Outputs]]] = []
        self.running = 0

    def start(self, tensors: Tensors) -> asyncio.Future[Outputs] | None:
        if self.running >= self.connections:
            return None
        self.running += 1
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: setattr(self, "running", self.running - 1))
        self.calls.append((len(tensors["x"]), future))
        future.tensors = tensors  # type: ignore[attr-defined]
        return future

    def answer(self, i: int) -> None:
        _, future = self.calls[i]
        future.set_result({"y": future.tensors["x"] * 2})  # type: ignore[attr-defined]


class Unused:
    """The threaded runner a LoopBatcher is given; these tests submit on the loop."""

    def __init__(self) -> None:
        self.submitted = 0
        self.closed = False

    def submit(self, tensors: Tensors, rows: int) -> object:
        self.submitted += 1
        return None

    def close(self) -> None:
        self.closed = True


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(start, start + 2 * n, dtype=np.float32).reshape(n, 2)}


def batcher(model: LoopModel, **kwargs: object) -> LoopBatcher:
    options: dict[str, object] = {"max_batch_size": 8, "max_wait": 5.0, **kwargs}
    return LoopBatcher(model.start, Unused(), **options)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_lone_request_goes_at_once_with_announced_ones_gone() -> None:
    async def main() -> None:
        model, arrivals = LoopModel(), Arrivals()
        b = batcher(model, arrivals=arrivals)
        with arrivals.coming() as arrived:
            future = b.submit(rows(0, 1), 1)
            arrived()
        await settle()
        assert [r for r, _ in model.calls] == [1]  # no wait for max_wait (5 s)
        model.answer(0)
        out = await asyncio.wrap_future(future)  # type: ignore[arg-type]
        np.testing.assert_array_equal(out["y"], rows(0, 1)["x"] * 2)

    asyncio.run(main())


def test_requests_arriving_while_a_call_runs_share_the_next_call() -> None:
    async def main() -> None:
        model = LoopModel()
        b = batcher(model)
        first = b.submit(rows(0, 1), 1)
        await settle()
        later = [b.submit(rows(10 * i, 2), 2) for i in range(1, 4)]
        await settle()
        assert [r for r, _ in model.calls] == [1]  # gathering while the first runs
        model.answer(0)
        await settle()
        assert [r for r, _ in model.calls] == [1, 6]
        model.answer(1)
        await asyncio.gather(first, *later)  # type: ignore[arg-type]
        for i, f in enumerate(later, start=1):
            np.testing.assert_array_equal(f.result()["y"], rows(10 * i, 2)["x"] * 2)

    asyncio.run(main())


def test_full_batches_go_while_a_call_runs_and_never_exceed_the_maximum() -> None:
    async def main() -> None:
        model = LoopModel(connections=2)
        b = batcher(model, max_batch_size=4)
        futures = [b.submit(rows(i, 4), 4) for i in range(3)]
        await settle()
        # Two calls on the two connections, the third waits for one to end.
        assert [r for r, _ in model.calls] == [4, 4]
        model.answer(0)
        await settle()
        assert [r for r, _ in model.calls] == [4, 4, 4]
        model.answer(1), model.answer(2)
        await asyncio.gather(*futures)  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_batch_waits_for_announced_requests_at_most_max_wait() -> None:
    async def main() -> None:
        model, arrivals = LoopModel(), Arrivals()
        b = batcher(model, arrivals=arrivals, max_wait=0.05)
        with arrivals.coming() as first_arrived, arrivals.coming():
            b.submit(rows(0, 1), 1)
            first_arrived()
            await settle()
            assert model.calls == []  # held open for the second, on its way
            await asyncio.sleep(0.2)
            assert [r for r, _ in model.calls] == [1]  # but not past max_wait

    asyncio.run(main())


def test_a_failing_call_fails_every_request_of_the_batch_and_wrong_rows_are_an_error() -> None:
    async def main() -> None:
        model = LoopModel()
        b = batcher(model)
        b.submit(rows(0, 1), 1)
        await settle()
        batch = [b.submit(rows(0, 1), 1) for _ in range(2)]
        model.answer(0)
        await settle()
        model.calls[1][1].set_exception(RuntimeError("the model broke"))
        for f in batch:
            with pytest.raises(RuntimeError, match="the model broke"):
                await f  # type: ignore[misc]
        wrong = b.submit(rows(0, 3), 3)
        await settle()
        model.calls[2][1].set_result({"y": np.zeros((2, 1))})
        with pytest.raises(ValueError, match="2 rows for 3 instances"):
            await wrong  # type: ignore[misc]

    asyncio.run(main())


def test_closing_fails_what_is_queued_and_refuses_more() -> None:
    async def main() -> None:
        model = LoopModel()
        b = batcher(model)
        running = b.submit(rows(0, 1), 1)
        await settle()
        queued = b.submit(rows(0, 1), 1)
        await asyncio.to_thread(b.close)  # from another thread, as the cache does
        await settle()
        with pytest.raises(ModelUnloaded):
            await queued  # type: ignore[misc]
        model.answer(0)
        assert (await running)["y"].shape == (1, 2)  # type: ignore[misc]
        with pytest.raises(ModelUnloaded):
            b.submit(rows(0, 1), 1)

    asyncio.run(main())


def test_requests_from_other_threads_go_to_the_threaded_batcher() -> None:
    model, threads = LoopModel(), Unused()
    b = LoopBatcher(model.start, threads, max_batch_size=8, max_wait=0.0)  # type: ignore[arg-type]
    b.submit(rows(0, 1), 1)
    assert threads.submitted == 1 and model.calls == []
    b.close()
    assert threads.closed


# ---- the wire: binary headers, the loop's reader ----


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_calls_and_answers_have_binary_headers_read_as_json_ones(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    tensors = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "s": np.array([b"ab", b""])}
    frame = encode_call("serving_default", tensors)
    assert frame[1][:1] == b"\x01" and b"{" not in bytes(frame[1])  # no JSON per call
    sender = threading.Thread(target=send, args=(a, frame))
    sender.start()
    header, body = receive(b)
    sender.join()
    assert header["op"] == "call" and header["signature"] == "serving_default"
    got = tensors_of(header, body)
    np.testing.assert_array_equal(got["x"], tensors["x"])
    assert list(got["s"]) == [b"ab", b""]
    send(a, encode_error("input", "x is wrong"))
    assert receive(b)[0] == {"op": "error", "kind": "input", "message": "x is wrong", "tensors": []}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x02\x01\x00", "cut short"),  # one tensor announced, none there
        (b"\x02\x00\x00junk", "past the end of a binary header"),
        (b"\x01\x09\x00serv", "runs past its end"),
        (b"\x03\x07\x00\x00\x00\x00", "an error of kind 7"),
        (b"\x02\x01\x00\x01\x00y\xff\x01", "dtype code 255"),
        (b"\x02\x01\x00\x01\x00y\x00\x21", "33 dimensions"),
    ],
)
def test_broken_binary_headers_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        model_wire.parse_header(memoryview(raw))


def test_the_loops_reader_reads_a_frame_in_pieces_within_its_limits(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.setblocking(False)
    data = b"".join(bytes(x) for x in encode_result({"y": np.ones((300, 300))}))
    reader = FrameReader()
    a.sendall(data[:5])
    assert reader.read_from(b) is None
    sender = threading.Thread(target=a.sendall, args=(data[5:],))
    sender.start()
    got = None
    while got is None:
        got = reader.read_from(b)
    sender.join()
    np.testing.assert_array_equal(tensors_of(*got)["y"], np.ones((300, 300)))
    a.sendall(data[:100])  # refused on its prefix, before its body is read
    with pytest.raises(WireError, match="a body of 720000 bytes \\(at most 1000\\)"):
        FrameReader(max_body=1000).read_from(b)
    a.close()
    with pytest.raises(Closed):
        FrameReader().read_from(b)


def test_an_answer_may_hold_no_more_than_its_signature_says() -> None:
    sig = SignatureInfo(
        "s",
        {"x": TensorInfo("x", "float32", (None, 2))},
        {"y": TensorInfo("y", "float32", (None, 3)), "z": TensorInfo("z", "int64", (None,))},
    )
    assert answer_limits(sig, 10)[1] == 10 * 3 * 4 + 10 * 8
    open_sig = SignatureInfo("s", sig.inputs, {"y": TensorInfo("y", "float32", (None, None))})
    assert answer_limits(open_sig, 10)[1] == model_wire.MAX_BODY
    strings = SignatureInfo("s", sig.inputs, {"y": TensorInfo("y", "string", (None,))})
    assert answer_limits(strings, 10)[1] == model_wire.MAX_BODY


def test_requests_that_waited_out_a_running_call_go_at_once_when_it_ends() -> None:
    """The wait for announced requests counts from the oldest queued request: those
    gathered while a call ran (longer than max_wait) are not held back again after it."""

    async def main() -> None:
        model, arrivals = LoopModel(), Arrivals()
        b = batcher(model, arrivals=arrivals, max_wait=0.05)
        b.submit(rows(0, 1), 1)
        await settle()
        with arrivals.coming() as arrived:
            b.submit(rows(0, 1), 1)
            arrived()
            with arrivals.coming():  # a third is on its way the whole time
                await asyncio.sleep(0.1)  # longer than max_wait: the first call still runs
                model.answer(0)
                await settle()
                assert [r for r, _ in model.calls] == [1, 1]

    asyncio.run(main())


def test_a_ready_batch_takes_the_free_connection_and_the_rest_merge_behind() -> None:
    """Batch-64 requests (ready_rows) each go on a free connection at once, not behind
    the running call; those behind two busy connections share the next call, up to
    max_batch_size. Smaller requests still gather behind the running call."""

    async def main() -> None:
        model = LoopModel(connections=2)
        b = batcher(model, max_batch_size=12, ready_rows=4)
        futures = []
        for i in range(4):  # one by one, as requests arrive
            futures.append(b.submit(rows(10 * i, 4), 4))
            await settle()
        assert [r for r, _ in model.calls] == [4, 4]  # both connections, no waiting
        model.answer(0)
        await settle()
        assert [r for r, _ in model.calls] == [4, 4, 8]  # the two queued, one call
        model.answer(1), model.answer(2)
        await asyncio.gather(*futures)  # type: ignore[arg-type]
        for i, f in enumerate(futures):
            np.testing.assert_array_equal(f.result()["y"], rows(10 * i, 4)["x"] * 2)
        small = [b.submit(rows(0, 1), 1)]
        await settle()
        small += [b.submit(rows(i, 1), 1) for i in range(1, 3)]
        await settle()
        assert [r for r, _ in model.calls][3:] == [1]  # under ready_rows: the two wait
        model.answer(3)
        await settle()
        assert [r for r, _ in model.calls][3:] == [1, 2]
        model.answer(4)
        await asyncio.gather(*small)  # type: ignore[arg-type]

    asyncio.run(main())


class Recorded(BatchSizes):
    """BatchSizes that keeps what each call was recorded as costing."""

    def __init__(self, ready_rows: int, max_batch_size: int) -> None:
        super().__init__(ready_rows, max_batch_size)
        self.recorded: list[tuple[int, float]] = []

    def record(self, rows: int, seconds: float) -> None:
        self.recorded.append((rows, seconds))
        super().record(rows, seconds)


def test_calls_running_at_once_share_the_models_time_between_them() -> None:
    """What a call is recorded as costing (for BatchSizes) is its share of the model's
    time: the time two calls run side by side counts half to each. The first call here
    ran 1 s alone and 4 s beside the second (3 s, not 5), the second 4 s beside the
    first and 2 s alone (4 s, not 6); a call alone is charged its wall time."""

    async def main() -> None:
        model = LoopModel(connections=2)
        sizes = Recorded(4, 12)
        b = batcher(model, max_batch_size=12, ready_rows=4, sizes=sizes)
        loop = asyncio.get_running_loop()
        clock = [100.0]
        loop.time = lambda: clock[0]  # type: ignore[method-assign]
        first = b.submit(rows(0, 4), 4)
        await settle()
        clock[0] += 1.0  # the first alone for 1 s
        second = b.submit(rows(10, 4), 4)
        await settle()
        assert [r for r, _ in model.calls] == [4, 4]
        clock[0] += 4.0  # both for 4 s
        model.answer(0)
        await settle()
        clock[0] += 2.0  # the second alone for 2 s
        model.answer(1)
        await asyncio.gather(first, second)  # type: ignore[arg-type]
        assert sizes.recorded == [(4, 3.0), (4, 4.0)]  # 1 + 4/2, and 4/2 + 2
        lone = b.submit(rows(0, 4), 4)
        await settle()
        clock[0] += 0.5
        model.answer(2)
        await asyncio.gather(lone)  # type: ignore[arg-type]
        assert sizes.recorded[-1] == (4, 0.5)

    asyncio.run(main())
