"""`LoopBatcher`: service.scoring.batching's policy (`DynamicBatcher`) on the event loop,
for the requests submitted there (the REST and gRPC predictions). The requests queue on
the loop, and a batch is handed to the model process's connection by the loop itself
(`LoopStart`: the frame written, the answer read as the socket is ready), with no thread
between the request and the model process. A lone request goes at once; while a call
runs, the requests that arrive are gathered and go as one call when it ends, or on a free
connection once they hold READY_ROWS rows (they merge up to max_batch_size behind busy
connections, while the model's larger calls cost no more per row than its calls of
READY_ROWS: service.scoring.batch_sizes, fed each call's share of the model's time).
Requests submitted from another thread go through the threaded batcher it is given.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from service.scoring.batch_sizes import BatchSizes
from service.scoring.batching import (
    Arrivals,
    LoopStart,
    ModelUnloaded,
    Outputs,
    Runner,
    Tensors,
    shape_of,
)


@dataclass
class _LoopPending:
    tensors: Tensors
    rows: int
    future: asyncio.Future[Outputs]
    since: float  # loop.time() when it was submitted


# How soon a batcher whose model had no free connection (taken by calls from threads, or
# by another signature's batcher) tries again, with none of its own calls running.
_RETRY = 0.0005


# Rows queued that go on a free connection at once, without waiting for the running call
# to end (`LoopBatcher`'s ready_rows): small requests gather behind a running call (what
# batching gains), a batch of this size is worth a call of its own on the other connection
# (a model that computes per row keeps both cores), and what queues behind both shares the
# next call up to max_batch_size (a small model's call costs the same for 64 rows or 256).
READY_ROWS = 64


class LoopBatcher:
    """DynamicBatcher's batches made on the event loop (see the module's docstring).

    `start` begins a model call on the loop; `threads` takes the requests submitted
    anywhere else (and is closed with this one)."""

    def __init__(
        self,
        start: LoopStart,
        threads: Runner,
        *,
        max_batch_size: int,
        max_wait: float,
        arrivals: Arrivals | None = None,
        ready_rows: int = READY_ROWS,
        sizes: BatchSizes | None = None,
    ) -> None:
        self._start = start
        self._threads = threads
        self.max_batch_size = max_batch_size
        self.ready_rows = min(ready_rows, max_batch_size)
        self.max_wait = max_wait
        self._arrivals = arrivals
        self._sizes = sizes or BatchSizes(self.ready_rows, max_batch_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[_LoopPending] = collections.deque()
        self._queued_rows = 0
        # This batcher's calls in flight, each with its share of the model's time so far:
        # the time since `_mark` is divided among the calls running at once (`_share_out`).
        self._shares: dict[asyncio.Future[Outputs], float] = {}
        self._mark = 0.0
        self._scheduled = False  # a pass of _pump is due
        self._waiting: asyncio.TimerHandle | None = None  # waiting for announced requests
        self._closed = False

    def submit(self, tensors: Tensors, rows: int) -> Future[Outputs]:
        if self._closed:
            raise ModelUnloaded("the model was unloaded")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or (self._loop is not None and loop is not self._loop):
            return self._threads.submit(tensors, rows)
        self._loop = loop
        future: asyncio.Future[Outputs] = loop.create_future()
        self._queue.append(_LoopPending(tensors, rows, future, loop.time()))
        self._queued_rows += rows
        # Looked at once the caller has said it arrived (it submits, then says so), and
        # with whatever else this pass of the loop submits.
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._pump)
        # The event loop's future: awaited as it is (asyncio.wrap_future returns it).
        return future  # type: ignore[return-value]

    def close(self) -> None:
        """Take no more requests; those queued fail with ModelUnloaded, those in a call
        get its answer. May be called from any thread."""
        self._closed = True
        self._threads.close()
        loop = self._loop
        if loop is not None:
            # A closed loop (RuntimeError) has nobody waiting on its futures.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._fail_queued)

    def _fail_queued(self) -> None:
        while self._queue:
            p = self._queue.popleft()
            if not p.future.done():
                p.future.set_exception(ModelUnloaded("the model was unloaded"))
        self._queued_rows = 0

    def _pump(self) -> None:
        self._scheduled = False
        while self._queue and not self._closed:
            ready = self._queued_rows >= self.ready_rows
            if self._shares and not ready:
                return  # gathering until the running call ends or a batch is ready
            if not ready and self._coming():
                # Announced requests may join, until max_wait after the oldest one queued
                # (which may have waited out a running call already).
                assert self._loop is not None
                delay = self._queue[0].since + self.max_wait - self._loop.time()
                if delay > 0:
                    if self._waiting is None:
                        self._waiting = self._loop.call_later(delay, self._wait_over)
                    return
            batch = self._take()
            if not batch:
                continue
            try:
                future = self._start(_merged(batch))
            except BaseException as e:
                _fail(batch, e)
                continue
            if future is None:  # no connection free: the batch goes first next time
                for p in reversed(batch):
                    self._queue.appendleft(p)
                    self._queued_rows += p.rows
                if not self._shares:
                    assert self._loop is not None
                    self._loop.call_later(_RETRY, self._pump)
                return
            self._share_out()
            self._shares[future] = 0.0
            future.add_done_callback(
                lambda f, batch=batch: self._finished(batch, f)  # type: ignore[misc]
            )

    def _share_out(self) -> None:
        """Divide the time since the last call started or ended among the calls running
        since: two calls of 64 rows at once, each 3 ms long, cost the model 1.5 ms each.
        Their wall time alone would count the model's time twice, and make the calls that
        run beside another look twice as dear per row as one large call taking the cores
        by itself."""
        assert self._loop is not None
        now = self._loop.time()
        if self._shares:
            share = (now - self._mark) / len(self._shares)
            for call in self._shares:
                self._shares[call] += share
        self._mark = now

    def _coming(self) -> bool:
        return self._arrivals is not None and self._arrivals.pending > 0

    def _wait_over(self) -> None:
        self._waiting = None
        self._pump()

    def _take(self) -> list[_LoopPending]:
        """The next batch: the first live request, and those after it of the same instance
        shape while they fit (in as many rows as `BatchSizes` says merges pay for)."""
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        batch: list[_LoopPending] = []
        rows = 0
        shape = None
        limit = self._sizes.limit()
        while self._queue:
            p = self._queue[0]
            if p.future.done():  # cancelled: its caller went away
                self._queue.popleft()
                self._queued_rows -= p.rows
                continue
            if batch and (rows + p.rows > limit or shape_of(p.tensors) != shape):
                break
            self._queue.popleft()
            self._queued_rows -= p.rows
            batch.append(p)
            rows += p.rows
            shape = shape_of(p.tensors)
        return batch

    def _finished(self, batch: list[_LoopPending], call: asyncio.Future[Outputs]) -> None:
        self._share_out()
        share = self._shares.pop(call)
        try:
            outputs = call.result()
            total = sum(p.rows for p in batch)
            for name, out in outputs.items():
                if len(out) != total:
                    raise ValueError(f"output {name} has {len(out)} rows for {total} instances")
        except BaseException as e:
            _fail(batch, e)
        else:
            self._sizes.record(total, share)
            start = 0
            for p in batch:
                end = start + p.rows
                if not p.future.done():
                    p.future.set_result({name: out[start:end] for name, out in outputs.items()})
                start = end
        self._pump()


def _merged(batch: list[_LoopPending]) -> Tensors:
    if len(batch) == 1:
        return batch[0].tensors
    first = batch[0].tensors
    return {name: np.concatenate([p.tensors[name] for p in batch]) for name in first}


def _fail(batch: list[_LoopPending], error: BaseException) -> None:
    for p in batch:
        if not p.future.done():
            p.future.set_exception(error)
