"""Training logs (see service.logs.base): pick a store, and read metrics out of log lines."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypedDict

from service.domain.manifest import MetricMatch, metric_pattern
from service.logs.base import LogRecord, LogStore, iso_utc

__all__ = [
    "LogRecord",
    "LogStore",
    "MetricPoint",
    "all_records",
    "extract_metrics",
    "open_log_store",
]

_STEP = metric_pattern(r"(?i)step[ =:]+(\d+)")


def open_log_store(kind: str, *, dir: str | None = None, url: str | None = None) -> LogStore:
    """The log store of `kind`: "file" (needs `dir`) or "redis" (needs `url`).

    Raises ValueError for an unknown kind or a missing location.
    """
    if kind == "file":
        if not dir:
            raise ValueError("the file log store needs a directory")
        from service.logs.files import FileLogStore

        return FileLogStore(Path(dir))
    if kind == "redis":
        if not url:
            raise ValueError("the redis log store needs a URL")
        from service.logs.redis import RedisLogStore  # imports redis only when used

        return RedisLogStore(url)
    raise ValueError(f"unknown log store kind {kind!r}; expected 'file' or 'redis'")


def all_records(store: LogStore, training_id: str) -> Iterator[LogRecord]:
    """Every record of the training's log so far, page by page (never all in memory)."""
    cursor: str | None = None
    while True:
        records, cursor = store.read(training_id, cursor)
        if not records:
            return
        yield from records


class MetricPoint(TypedDict):
    value: float
    learner: int
    timestamp: str  # ISO 8601, UTC, e.g. 2024-05-01T12:00:00.123Z
    step: int | None


def extract_metrics(
    records: Iterable[LogRecord], metrics: Sequence[tuple[str, str]]
) -> dict[str, list[MetricPoint]]:
    """Metric values found in log lines, per metric name, in record order.

    `metrics` is (name, regex) pairs; the regex's first group (the whole match if it has
    none) is the value, its first match per line counts. Values that are not finite floats
    are skipped. `step` is the number after "step" (`step[ =:]+N`, any case) in the same
    line, or None. Every name is in the result, with an empty list if nothing matched.
    The regexes run on RE2 (`metric_pattern`): linear in the line, whatever the pattern.
    Raises ValueError for a regex RE2 does not compile.
    """
    compiled = [(name, metric_pattern(regex)) for name, regex in metrics]
    result: dict[str, list[MetricPoint]] = {name: [] for name, _ in metrics}
    for record in records:
        step_match: MetricMatch | None = None
        step_searched = False
        for name, pattern in compiled:
            match = pattern.search(record.line)
            if match is None:
                continue
            text = match.group(1) if pattern.groups else match.group(0)
            if text is None:  # the group did not take part
                continue
            try:
                value = float(text)
            except ValueError:
                continue
            if not math.isfinite(value):
                continue
            if not step_searched:
                step_match, step_searched = _STEP.search(record.line), True
            result[name].append(
                MetricPoint(
                    value=value,
                    learner=record.learner,
                    timestamp=iso_utc(record.ts),
                    step=_step(step_match),
                )
            )
    return result


def _step(match: MetricMatch | None) -> int | None:
    step = match.group(1) if match is not None else None
    return int(step) if step is not None else None
