"""Training logs: every learner's stdout/stderr, line by line, tagged with learner and time.

Learner wrappers append; the API reads (and follows) them. The file store needs no server
(the embedded default); the Redis store (streams) lets learners and API replicas on many
machines share one live log. When a training ends its log is archived to the object store
under results/learner-<i>/training-log.txt, so logs outlive the learners.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import NamedTuple, Protocol


@functools.lru_cache(maxsize=4096)
def iso_utc(ts: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC with milliseconds:
    `2024-05-01T12:00:00.123Z`, the form of every time stamp in logs and metrics.

    Kept for the last 4,096 stamps: the lines of one read of a learner's output share
    theirs, and formatting it again for each line was a third of the API's time following
    a learner that prints as fast as it can."""
    stamp = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class LogStoreUnavailable(Exception):
    """The log store cannot be reached now (its server is down or restarting); str(err)
    names the store, never a password."""


class LogRecord(NamedTuple):
    """One log line. A named tuple, not a dataclass: a learner printing as fast as it can
    makes one per line, and a tuple is made in half the time of a frozen dataclass."""

    learner: int
    ts: float  # seconds since the epoch, when the wrapper read the line
    line: str  # without the trailing newline

    def render(self) -> str:
        """The text/plain form the API serves: `<iso time> [learner <i>] <line>`."""
        return f"{iso_utc(self.ts)} [learner {self.learner}] {self.line}"


class LogBlock(NamedTuple):
    """Lines one learner's wrapper read from its command's output at once: they share the
    learner and the time stamp, so a block costs one tuple, not one per line (a learner
    printing as fast as it can spent a third of its wrapper's time making a record a line)."""

    learner: int
    ts: float
    lines: Sequence[str]  # each without its newline


def blocks_of(records: Sequence[LogRecord]) -> Iterator[LogBlock]:
    """The records as blocks, in order: each run of records with one learner and stamp."""
    start = 0
    for i in range(1, len(records) + 1):
        if i == len(records) or records[i][:2] != records[start][:2]:
            first = records[start]
            yield LogBlock(first.learner, first.ts, [r.line for r in records[start:i]])
            start = i


def records_of(blocks: Sequence[LogBlock]) -> list[LogRecord]:
    """The blocks' lines as records, in order."""
    return [LogRecord(b.learner, b.ts, line) for b in blocks for line in b.lines]


class LogStore(Protocol):
    def append(self, training_id: str, records: Sequence[LogRecord]) -> None: ...

    def append_blocks(self, training_id: str, blocks: Sequence[LogBlock]) -> None:
        """As `append` of the blocks' records, in order (what the log tee sends)."""
        ...

    def read(
        self, training_id: str, cursor: str | None = None, limit: int = 10_000
    ) -> tuple[list[LogRecord], str]:
        """Records after `cursor` (all learners, in arrival order per learner) and the
        cursor to continue from. An unknown training reads as empty."""
        ...

    def wait(self, training_id: str, cursor: str | None, timeout: float) -> None:
        """Block up to `timeout` seconds until there may be records after `cursor`."""
        ...

    def delete(self, training_id: str) -> None: ...
