"""A training's metric regexes applied to its learner's output as the log tee writes it, so
that GET .../metrics reads one small document per learner (keys.log_metrics_key) instead of
scanning the whole log.

The output is the tenant's, so untrusted; the regexes run on RE2 (linear in the line) in
this learner's wrapper, in a thread of their own: the tee hands each batch it has written
over (`feed`, which never waits) and goes on. Should the extractor fall more than
_MAX_BACKLOG_BYTES behind, the batches beyond are not searched (counted in the document's
`skipped_lines`) rather than slowing the command's output down.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from service.domain.metrics import LogMetricExtractor

# Records searched at once (their lines joined, for one RE2 pass over them), and the most
# time the thread keeps the GIL for them before it gives it up.
_SLICE = 1024
_HOLD_SECONDS = 0.001
# Bytes of lines handed over but not yet searched; beyond them batches are skipped.
_MAX_BACKLOG_BYTES = 16 * 1024 * 1024


class LogMetrics:
    """The metric points of one learner's output so far, found in a thread of their own
    from `start` until `close`."""

    def __init__(
        self,
        learner_id: int,
        definitions: Sequence[tuple[str, str]],
        *,
        max_backlog_bytes: int = _MAX_BACKLOG_BYTES,
    ) -> None:
        self.learner_id = learner_id
        self._extractor = LogMetricExtractor(definitions)
        for name, reason in self._extractor.refused.items():
            print(
                f"learner wrapper: the metric {name!r} is not extracted: its regex {reason}",
                file=sys.stderr,
                flush=True,
            )
        self._max_backlog = max_backlog_bytes
        self._cond = threading.Condition()
        # Batches handed over; an int: that many lines skipped.
        self._queue: deque[_Batch | int] = deque()
        self._backlog = 0
        self._closed = False
        self._lock = threading.Lock()  # the extractor's points, between it and `document`
        self._thread = threading.Thread(target=self._run, name="log-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def feed(self, ts: float, lines: Sequence[str], size: int, cuts: Sequence[int] = ()) -> None:
        """Hand a block of the output over: its lines, read at `ts`, `size` their bytes,
        `cuts` the indexes of those the tee cut (their line goes on in the next one).
        Never waits."""
        with self._cond:
            if self._closed:
                return
            if self._backlog + size > self._max_backlog:
                if self._queue and isinstance(self._queue[-1], int):
                    self._queue[-1] += len(lines)
                else:
                    self._queue.append(len(lines))
            else:
                self._queue.append(_Batch(ts, lines, size, cuts))
                self._backlog += size
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Search what was handed over (up to `timeout` s), then stop; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def version(self) -> tuple[int, int, bool]:
        """Changes whenever the document does (its points, skipped lines, truncation)."""
        with self._lock:
            e = self._extractor
            return e.count, e.skipped_lines, e.truncated

    def document(self) -> bytes:
        """What is stored at keys.log_metrics_key, as JSON."""
        with self._lock:
            document = self._extractor.document(self.learner_id)
            return json.dumps(document, separators=(",", ":")).encode("utf-8")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                item = self._queue.popleft()
                if not isinstance(item, int):
                    self._backlog -= item.size
            try:
                if isinstance(item, int):
                    with self._lock:
                        self._extractor.skip(item)
                    continue
                self._search(item)
            except Exception as e:  # never the training's end: its metrics stop, it runs on
                print(f"learner wrapper: extracting metrics failed: {e}", file=sys.stderr)
                with self._cond:
                    self._closed = True
                    self._queue.clear()
                return

    def _search(self, batch: _Batch) -> None:
        lines = batch.lines
        cuts = set(batch.cuts)
        feed = self._extractor.feed_batch
        held = time.perf_counter()
        for start in range(0, len(lines), _SLICE):
            chunk = lines[start : start + _SLICE]
            stamps = [batch.ts] * len(chunk)
            if cuts:
                ends = [i not in cuts for i in range(start, start + len(chunk))]
            else:
                ends = [True] * len(chunk)
            with self._lock:
                feed(stamps, chunk, ends)
            if time.perf_counter() - held > _HOLD_SECONDS:
                # Give the GIL up: the tee's threads, which the command's output waits on,
                # go first. (Not after every slice: a thread that gives it up waits for it
                # the interpreter's switch interval, 5 ms, while they are busy.)
                time.sleep(0)
                held = time.perf_counter()


class _Batch(NamedTuple):
    ts: float
    lines: Sequence[str]
    size: int
    cuts: Sequence[int]
