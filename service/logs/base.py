"""Training logs: every learner's stdout/stderr, line by line, tagged with learner and time.

Learner wrappers append; the API reads (and follows) them. The file store needs no server
(the embedded default); the Redis store (streams) lets learners and API replicas on many
machines share one live log. When a training ends its log is archived to the object store
under results/learner-<i>/training-log.txt, so logs outlive the learners.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
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


class LogStore(Protocol):
    def append(self, training_id: str, records: Sequence[LogRecord]) -> None: ...

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
