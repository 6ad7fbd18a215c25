"""Training logs (see service.logs.base): pick a store, read it a page at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path

from service.logs.base import LogRecord, LogStore, LogStoreUnavailable, iso_utc

__all__ = [
    "LogPage",
    "LogRecord",
    "LogStore",
    "LogStoreUnavailable",
    "all_records",
    "open_log_store",
    "read_page",
    "render_lines",
]


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


# Records per store read: bounds what one read holds (a record is at most 64 KiB of line).
READ_BATCH = 256


def render_lines(
    records: Iterable[LogRecord], keep: Callable[[LogRecord], bool] | None = None
) -> bytes:
    """The kept records (all with no `keep`) as the API serves them: one rendered line
    each, UTF-8 (each record's `render()`). The records of one read of a learner's output
    share their learner and stamp, so each run of them is rendered as one: its prefix
    formatted once and its lines joined (a format a line was most of a follower's time on
    a learner printing as fast as it can)."""
    if keep is not None:
        records = filter(keep, records)
    parts: list[str] = []
    for (learner, ts), run in groupby(records, _LEARNER_TS):
        prefix = f"{iso_utc(ts)} [learner {learner}] "
        parts += (prefix, ("\n" + prefix).join(map(_LINE, run)), "\n")
    return "".join(parts).encode("utf-8", "replace")


_LEARNER_TS = itemgetter(0, 1)
_LINE = itemgetter(2)


def _keep_all(record: LogRecord) -> bool:
    return True


def _line(record: LogRecord) -> bytes:
    return (record.render() + "\n").encode("utf-8", "replace")


@dataclass(frozen=True)
class LogPage:
    text: bytes  # the kept records' rendered lines
    cursor: str  # just past the last record looked at
    more: bool  # stopped at a cap: read again from `cursor` for the rest


def read_page(
    store: LogStore,
    training_id: str,
    cursor: str | None,
    *,
    keep: Callable[[LogRecord], bool] | None,
    max_bytes: int,
    max_records: int,
) -> LogPage:
    """The kept records after `cursor`, rendered, up to `max_bytes` of lines (at least one
    line, so a page always moves on) and `max_records` records looked at (kept or not).
    The cursor is exact: the next page starts with the first record this one left out.
    Raises ValueError for an invalid cursor."""
    if keep is None:
        keep = _keep_all
    text = bytearray()
    looked = 0
    after = cursor
    while looked < max_records:
        batch = min(READ_BATCH, max_records - looked)
        limit = batch
        while True:
            records, next_cursor = store.read(training_id, after, limit)
            lines = [_line(r) if keep(r) else b"" for r in records]
            fit = _fitting(lines, max_bytes - len(text), first=not text)
            if fit == len(records):
                break
            # Cut inside this batch: read exactly the records that fit, for a cursor just
            # past them. (Fewer than asked, so this ends; a log that grew between the two
            # reads is measured again.)
            limit = fit
        text += b"".join(lines)
        looked += len(records)
        after = next_cursor
        if limit < batch:
            return LogPage(bytes(text), after, more=True)
        if len(records) < limit:
            return LogPage(bytes(text), after, more=False)
    return LogPage(bytes(text), after or "", more=True)


def _fitting(lines: Sequence[bytes], budget: int, *, first: bool) -> int:
    """How many of `lines`, from the first, fit in `budget` bytes (one at least if `first`
    and there is one: a page always holds a line)."""
    used = 0
    for i, line in enumerate(lines):
        used += len(line)
        if used > budget and not (first and used == len(line)):
            return i
    return len(lines)
