"""How model calls are scheduled: merged into batches, or one call per request.

`DynamicBatcher` is TensorFlow Serving's batching in small: requests queue up; a batch
thread takes the first, waits at most `max_wait` for more to arrive (or until
`max_batch_size` instances are gathered), concatenates them along the first dimension,
calls the model once and hands every request its slice of the outputs. With several batch
threads, one gathers the next batch while another runs the model.

Waiting only pays when more requests are coming. When the batcher is given `Arrivals`
(the requests announced for this model that have not been submitted yet: they are being
authenticated and parsed), it stops gathering as soon as the queue is empty and nothing is
on its way, so a lone request is not held back for `max_wait`. Without it, it waits the
full `max_wait` like TensorFlow Serving's batch timeout. While another batch thread is
calling the model, a gathering thread goes on gathering, past `max_wait`, until that call
ends or its batch is full: a second call would only share the same cores, and the longer
the model takes, the more requests each call can serve.

`LoopBatcher` (service.scoring.loop_batching) is the same policy on the event loop, for
the requests submitted there.

`DirectRunner` is the same interface without batching: each request is its own model
call, `threads` of them at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

Tensors = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
ModelCall = Callable[[Tensors], Outputs]
# A model call started on the running loop: its future, or None while the model can take
# no more calls (every connection to its process is in use).
LoopStart = Callable[[Tensors], "asyncio.Future[Outputs] | None"]


class ModelUnloaded(RuntimeError):
    """The model was unloaded (its deployment deleted) before it could answer."""


class Arrivals:
    """How many requests for a model are on their way to its batchers."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return self._count

    @contextmanager
    def coming(self) -> Iterator[Callable[[], None]]:
        """Count a request until it calls the yielded `arrived` (right after submitting)
        or leaves the block (refused before it got there)."""
        done = False

        def arrived() -> None:
            nonlocal done
            if not done:
                done = True
                with self._lock:
                    self._count -= 1

        with self._lock:
            self._count += 1
        try:
            yield arrived
        finally:
            arrived()


class Runner(Protocol):
    def submit(self, tensors: Tensors, rows: int) -> Future[dict[str, np.ndarray]]:
        """Schedule a model call on `tensors` (`rows` instances along the first dimension);
        the future holds the outputs for exactly these rows."""
        ...

    def close(self) -> None: ...


class DirectRunner:
    def __init__(self, call: ModelCall, *, threads: int, name: str = "model") -> None:
        self._call = call
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"score-{name}")
        self._closed = False

    def submit(self, tensors: Tensors, rows: int) -> Future[dict[str, np.ndarray]]:
        try:
            if self._closed:
                raise RuntimeError("closed")
            return self._pool.submit(self._call, tensors)
        except RuntimeError as e:  # closed, here or in the pool
            raise ModelUnloaded("the model was unloaded") from e

    def close(self) -> None:
        """Take no more requests; those submitted still get their answers."""
        self._closed = True
        self._pool.shutdown(wait=False)


@dataclass
class _Pending:
    tensors: Tensors
    rows: int
    future: Future[dict[str, np.ndarray]] = field(default_factory=Future)


# How often a thread gathering beside a running call looks whether that call has ended.
_BUSY_POLL = 0.0005


class _Stop:
    """Put once per batch thread to end it."""


_STOP = _Stop()


class DynamicBatcher:
    def __init__(
        self,
        call: ModelCall,
        *,
        max_batch_size: int,
        max_wait: float,
        threads: int = 1,
        name: str = "model",
        arrivals: Arrivals | None = None,
    ) -> None:
        self._call = call
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self._arrivals = arrivals
        # Batch threads calling the model right now.
        self._running = 0
        self._count_lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Pending | _Stop] = queue.SimpleQueue()
        # One thread gathers at a time, so batches fill up instead of splitting the queue.
        self._gather = threading.Lock()
        # A request that did not fit the previous batch starts the next one.
        self._carry: _Pending | None = None
        self._closed = False
        self._threads = [
            threading.Thread(target=self._loop, name=f"batch-{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, tensors: Tensors, rows: int) -> Future[dict[str, np.ndarray]]:
        if self._closed:
            raise ModelUnloaded("the model was unloaded")
        pending = _Pending(tensors, rows)
        self._queue.put(pending)
        return pending.future

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(_STOP)

    def _loop(self) -> None:
        while True:
            with self._gather:
                batch = self._next_batch()
            if batch is None:
                self._fail_leftovers()
                return
            self._run(batch)

    def _fail_leftovers(self) -> None:
        stops = 0
        with self._gather:
            leftovers = [self._carry] if self._carry is not None else []
            self._carry = None
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Stop):
                    stops += 1
                else:
                    leftovers.append(item)
            for _ in range(stops):
                self._queue.put(_STOP)
        for p in leftovers:
            if p.future.set_running_or_notify_cancel():
                p.future.set_exception(ModelUnloaded("the model was unloaded"))

    def _next_batch(self) -> list[_Pending] | None:
        first = self._carry
        self._carry = None
        if first is None:
            item = self._queue.get()
            if isinstance(item, _Stop):
                return None
            first = item
        batch, rows, shape = [first], first.rows, _instance_shape(first)
        deadline = time.monotonic() + self.max_wait
        while rows < self.max_batch_size:
            busy = self._running > 0
            if not busy and self._nothing_coming():
                break
            remaining = deadline - time.monotonic()
            # Past the deadline, still take what is already waiting.
            timeout = _BUSY_POLL if busy else remaining
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                if busy:
                    continue
                break
            if isinstance(item, _Stop):
                self._queue.put(item)  # for the thread that owns it, after this batch
                break
            if rows + item.rows > self.max_batch_size or _instance_shape(item) != shape:
                self._carry = item
                break
            batch.append(item)
            rows += item.rows
        return batch

    def _nothing_coming(self) -> bool:
        return self._arrivals is not None and (self._arrivals.pending <= 0 and self._queue.empty())

    def _run(self, batch: list[_Pending]) -> None:
        with self._count_lock:
            self._running += 1
        try:
            self._call_batch(batch)
        finally:
            with self._count_lock:
                self._running -= 1

    def _call_batch(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if p.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            if len(live) == 1:
                live[0].future.set_result(self._call(live[0].tensors))
                return
            merged = {
                name: np.concatenate([p.tensors[name] for p in live]) for name in live[0].tensors
            }
            outputs = self._call(merged)
            total = sum(p.rows for p in live)
            for name, out in outputs.items():
                if len(out) != total:
                    raise ValueError(f"output {name} has {len(out)} rows for {total} instances")
            start = 0
            for p in live:
                end = start + p.rows
                p.future.set_result({name: out[start:end] for name, out in outputs.items()})
                start = end
        except BaseException as e:  # every waiting request learns why, not just the first
            for p in live:
                if not p.future.done():
                    p.future.set_exception(e)
            if not isinstance(e, Exception):
                raise


def shape_of(tensors: Tensors) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Every input's shape past the first dimension, by name."""
    return tuple((name, t.shape[1:]) for name, t in sorted(tensors.items()))


def _instance_shape(pending: _Pending) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """What must match for two requests to share a model call: every input's shape past
    the first dimension (signatures may leave those open too)."""
    return shape_of(pending.tensors)
