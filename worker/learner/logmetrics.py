"""A training's metric regexes applied to its learner's output as the log tee writes it, so
that GET .../metrics reads one small document per learner (keys.log_metrics_key) instead of
scanning the whole log.

The output is the tenant's, so untrusted; the regexes run on RE2 (linear in the line) in
this learner's wrapper, in a thread of their own: the tee hands each batch it has written
over (`feed`, which never waits) and goes on. Should the extractor fall more than
_MAX_BACKLOG_CHARS behind, the batches beyond are not searched (counted in the document's
`skipped_lines`) rather than slowing the command's output down.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from collections.abc import Sequence

from service.domain.metrics import LogMetricExtractor
from service.logs.base import LogRecord

# Characters of lines handed over but not yet searched; beyond it batches are skipped.
_MAX_BACKLOG_CHARS = 16 * 1024 * 1024


class LogMetrics:
    """The metric points of one learner's output so far, found in a thread of their own
    from `start` until `close`."""

    def __init__(
        self,
        learner_id: int,
        definitions: Sequence[tuple[str, str]],
        *,
        max_backlog_chars: int = _MAX_BACKLOG_CHARS,
    ) -> None:
        self.learner_id = learner_id
        self._extractor = LogMetricExtractor(definitions)
        for name, reason in self._extractor.refused.items():
            print(
                f"learner wrapper: the metric {name!r} is not extracted: its regex {reason}",
                file=sys.stderr,
                flush=True,
            )
        self._max_backlog = max_backlog_chars
        self._cond = threading.Condition()
        # Batches handed over: (records, whether each ends its line); an int: that many
        # records skipped.
        self._queue: deque[tuple[Sequence[LogRecord], Sequence[bool]] | int] = deque()
        self._backlog = 0
        self._closed = False
        self._lock = threading.Lock()  # the extractor's points, between it and `document`
        self._thread = threading.Thread(target=self._run, name="log-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def feed(self, records: Sequence[LogRecord], ends: Sequence[bool]) -> None:
        """Hand a batch of the output over (`ends[i]`: whether records[i] ends its line, or
        the tee cut it and the next record goes on with it). Never waits."""
        size = sum(len(r.line) for r in records)
        with self._cond:
            if self._closed:
                return
            if self._backlog + size > self._max_backlog:
                if self._queue and isinstance(self._queue[-1], int):
                    self._queue[-1] += len(records)
                else:
                    self._queue.append(len(records))
            else:
                self._queue.append((records, ends))
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
                    self._backlog -= sum(len(r.line) for r in item[0])
            try:
                with self._lock:
                    if isinstance(item, int):
                        self._extractor.skip(item)
                        continue
                    feed = self._extractor.feed
                    for record, ends_line in zip(*item, strict=True):
                        feed(record.ts, record.line, ends_line=ends_line)
            except Exception as e:  # never the training's end: its metrics stop, it runs on
                print(f"learner wrapper: extracting metrics failed: {e}", file=sys.stderr)
                with self._cond:
                    self._closed = True
                    self._queue.clear()
                return
