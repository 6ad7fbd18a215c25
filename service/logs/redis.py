"""A log store on Redis streams: learners and API replicas on many machines share one log.

One stream per training, `dlaas:logs:<training_id>`, one entry per line with the fields
learner, ts and line. The cursor is the id of the last entry read ("0-0" is the start);
records come in arrival order (the order the stream received them).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any, cast

import redis

from service.logs.base import LogBlock, LogRecord, LogStoreUnavailable, blocks_of

KEY_PREFIX = "dlaas:logs:"
MAX_LEN = 1_000_000  # entries kept per training (approximately; older ones are trimmed)
_START = "0-0"
_ID = re.compile(r"[0-9]+-[0-9]+")
# ARGV: the stream's length cap, then per block its learner, its stamp, how many lines it
# has and the lines, in order.
_APPEND = """
local key, maxlen = KEYS[1], ARGV[1]
local i, added = 2, 0
while i <= #ARGV do
  local learner, ts, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  for j = i + 3, i + 2 + n do
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'learner', learner, 'ts', ts,
               'line', ARGV[j])
  end
  added = added + n
  i = i + 3 + n
end
return added
"""


def _cursor(cursor: str | None) -> str:
    if not cursor:
        return _START
    if not _ID.fullmatch(cursor):
        raise ValueError(f"invalid log cursor: {cursor!r}")
    return cursor


class RedisLogStore:
    """LogStore over one Redis stream per training."""

    def __init__(self, url: str) -> None:
        # `replace` keeps a line with odd characters (lone surrogates) from failing a batch;
        # the connect timeout keeps an unreachable server from stalling a learner for minutes.
        self.client = redis.Redis.from_url(
            url, decode_responses=True, encoding_errors="replace", socket_connect_timeout=5
        )
        kwargs = self.client.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        self.description = f"the Redis log store at {where}"
        # Sent by its hash (EVALSHA), and loaded again by redis-py if the server lost it.
        self._append = self.client.register_script(_APPEND)

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """A server that is down or restarting: LogStoreUnavailable, naming the store."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise LogStoreUnavailable(f"{self.description} is unavailable: {e}") from e

    @staticmethod
    def key(training_id: str) -> str:
        """The stream that holds the training's log."""
        return KEY_PREFIX + training_id

    def append(self, training_id: str, records: Sequence[LogRecord]) -> None:
        """Add the records to the training's stream in one round trip (`append_blocks`)."""
        self.append_blocks(training_id, list(blocks_of(records)))

    def append_blocks(self, training_id: str, blocks: Sequence[LogBlock]) -> None:
        """Add the blocks' lines to the training's stream in one round trip: one call of a
        script that adds them in order, taking each block's learner and stamp once. (A
        pipeline of one XADD per line cost the learner ~30 µs of CPU a line to encode the
        commands and parse their replies; a script's arguments per line, a fraction of
        that, and one a line rather than three halved it again.)"""
        args: list[Any] = [MAX_LEN]
        for block in blocks:
            if block.lines:
                args += (block.learner, repr(block.ts), len(block.lines), *block.lines)
        if len(args) == 1:
            return
        with self._reaching():
            self._append(keys=[self.key(training_id)], args=args)

    def read(
        self, training_id: str, cursor: str | None = None, limit: int = 10_000
    ) -> tuple[list[LogRecord], str]:
        """Up to `limit` records after `cursor` in arrival order, and the cursor after them.
        Raises ValueError for an invalid cursor."""
        last = _cursor(cursor)
        if limit <= 0:
            return [], last
        with self._reaching():
            entries = cast(
                list[tuple[str, dict[str, str]]],
                self.client.xrange(self.key(training_id), min=f"({last}", max="+", count=limit),
            )
        records = [_record(fields) for _id, fields in entries]
        return records, entries[-1][0] if entries else last

    def wait(self, training_id: str, cursor: str | None, timeout: float) -> None:
        """Return once an entry exists after `cursor`, or after `timeout` seconds.
        Raises ValueError for an invalid cursor."""
        streams: dict[Any, Any] = {self.key(training_id): _cursor(cursor)}
        with self._reaching():
            if timeout <= 0:  # BLOCK 0 would wait forever
                self.client.xread(streams, count=1)
            else:
                self.client.xread(streams, count=1, block=max(1, round(timeout * 1000)))

    def delete(self, training_id: str) -> None:
        """Remove the training's stream."""
        with self._reaching():
            self.client.delete(self.key(training_id))

    def close(self) -> None:
        """Release the connection pool."""
        self.client.close()


def _record(fields: dict[str, str]) -> LogRecord:
    return LogRecord(int(fields["learner"]), float(fields["ts"]), fields.get("line", ""))
