"""A log store in a directory: no server, the embedded default.

Layout: `<root>/<training_id>/learner-<i>.jsonl`, one JSON object `{"ts": ..., "line": ...}`
per line. Each learner file has a single writer (that learner's wrapper), which appends one
batch of whole lines with one O_APPEND write; readers only ever consume lines that end in a
newline, so a write in progress is never seen half.

The cursor is opaque to callers: URL-safe base64 of the per-learner byte offsets read so far.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import os
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import itemgetter
from pathlib import Path

import orjson

from service.logs.base import LogBlock, LogRecord, blocks_of
from service.private import FILE_MODE, private_dir

_FILE = re.compile(r"learner-([0-9]+)\.jsonl")
_CHUNK = 64 * 1024
_POLL_SECONDS = 0.02


def encode_cursor(offsets: dict[int, int]) -> str:
    """The opaque cursor for per-learner byte offsets."""
    data = json.dumps({str(k): v for k, v in sorted(offsets.items())}, separators=(",", ":"))
    return base64.urlsafe_b64encode(data.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> dict[int, int]:
    """Per-learner byte offsets from a cursor (None or "" is the start); raises ValueError."""
    if not cursor:
        return {}
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"invalid log cursor: {cursor!r}") from e
    if not isinstance(data, dict):
        raise ValueError(f"invalid log cursor: {cursor!r}")
    offsets: dict[int, int] = {}
    for key, value in data.items():
        if not key.isdigit() or type(value) is not int or value < 0:
            raise ValueError(f"invalid log cursor: {cursor!r}")
        offsets[int(key)] = value
    return offsets


class FileLogStore:
    """LogStore over `<root>/<training_id>/learner-<i>.jsonl` files."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, training_id: str) -> Path:
        if training_id in ("", ".", "..") or "/" in training_id or "\0" in training_id:
            raise ValueError(f"invalid training id: {training_id!r}")
        return self.root / training_id

    def _files(self, training_id: str) -> dict[int, Path]:
        directory = self._dir(training_id)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return {}
        return {int(m.group(1)): directory / name for name in names if (m := _FILE.fullmatch(name))}

    def append(self, training_id: str, records: Sequence[LogRecord]) -> None:
        """Append records (one write per learner file); newlines inside a line stay escaped."""
        self.append_blocks(training_id, list(blocks_of(records)))

    def append_blocks(self, training_id: str, blocks: Sequence[LogBlock]) -> None:
        """Append the blocks' lines as records, one write per learner file."""
        batches: dict[int, list[bytes]] = defaultdict(list)
        for block in blocks:
            if block.lines:
                batches[block.learner].append(_encode_block(block))
        if not batches:
            return
        directory = self._dir(training_id)
        private_dir(directory)
        for learner, parts in batches.items():
            path = directory / f"learner-{learner}.jsonl"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
            try:
                data = b"".join(parts)
                while data:  # a regular file takes it all at once; loop only for safety
                    data = data[os.write(fd, data) :]
            finally:
                os.close(fd)

    def read(
        self, training_id: str, cursor: str | None = None, limit: int = 10_000
    ) -> tuple[list[LogRecord], str]:
        """Up to `limit` complete records after `cursor`, learners merged in ts order, and
        the cursor just past the returned ones. Raises ValueError for an invalid cursor."""
        offsets = decode_cursor(cursor)
        if limit <= 0:
            return [], encode_cursor(offsets)
        reads = [
            (learner, *_read_file(learner, path, offsets.get(learner, 0), limit))
            for learner, path in sorted(self._files(training_id).items())
        ]
        reads = [read for read in reads if read[1]]
        if len(reads) == 1:  # one learner with new lines (the usual): no merge
            learner, records, ends = reads[0]
            offsets[learner] = ends[-1]
            return records, encode_cursor(offsets)
        merged: list[LogRecord] = []
        # Each learner's records stay in file order, so every learner contributes a prefix
        # and its offset can advance exactly over what is returned.
        streams = [
            zip(records, ends, [learner] * len(ends), strict=True)
            for learner, records, ends in reads
        ]
        for record, end, learner in heapq.merge(*streams, key=_stamp):
            merged.append(record)
            offsets[learner] = end
            if len(merged) == limit:
                break
        return merged, encode_cursor(offsets)

    def wait(self, training_id: str, cursor: str | None, timeout: float) -> None:
        """Return once a complete record exists after `cursor`, or after `timeout` seconds.
        Raises ValueError for an invalid cursor."""
        offsets = decode_cursor(cursor)
        scanned = dict(offsets)  # how far each file is known to hold no newline
        deadline = time.monotonic() + timeout
        while True:
            for learner, path in self._files(training_id).items():
                start = scanned.get(learner, 0)
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    continue
                if size > start:
                    found, scanned[learner] = _find_newline(path, start)
                    if found:
                        return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(_POLL_SECONDS, remaining))

    def delete(self, training_id: str) -> None:
        """Remove every record of the training (nothing happens if it has none)."""
        shutil.rmtree(self._dir(training_id), ignore_errors=True)


def _stamp(read: tuple[LogRecord, int, int]) -> float:
    return read[0].ts


def _read_file(
    learner: int, path: Path, offset: int, limit: int
) -> tuple[list[LogRecord], list[int]]:
    """At most `limit` complete records of one learner file from `offset`, and the file
    offset just past each."""
    records: list[LogRecord] = []
    ends: list[int] = []
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return records, ends
    with f:
        f.seek(offset)
        pending = b""
        while len(records) < limit:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if not lines:
                continue
            del lines[limit - len(records) :]
            records += _parse_lines(learner, lines, records[-1].ts if records else 0.0)
            # The offset past each line: its own length and its newline's, summed.
            ends += accumulate(map((1).__add__, map(len, lines)), initial=offset)
            del ends[-len(lines) - 1]  # `initial`: where these lines began
            offset = ends[-1]
    return records, ends


def _parse_lines(learner: int, lines: list[bytes], last_ts: float) -> list[LogRecord]:
    """Stored lines as records, all parsed by one orjson call (a call of orjson costs
    ~1 µs however little it parses: one a line was most of a follower's time). Where that
    fails or a line is not a record as this store writes them, line by line (`_parse`)."""
    try:
        data = orjson.loads(b"[" + b",".join(lines) + b"]")
        if len(data) == len(lines):  # else a line held more than one value
            stamps = list(map(float, map(_TS, data)))
            texts = list(map(str, map(_LINE, data)))
            return list(map(LogRecord, repeat(learner), stamps, texts))
    except (ValueError, KeyError, TypeError):
        pass
    records = []
    for raw in lines:
        records.append(_parse(learner, raw, last_ts))
        last_ts = records[-1].ts
    return records


_TS = itemgetter("ts")
_LINE = itemgetter("line")


def _encode_block(block: LogBlock) -> bytes:
    """The block's stored lines, one record `{"ts": ..., "line": ...}` each, byte for byte
    as orjson writes such an object, made from one orjson call on the list of lines: a
    call of orjson costs ~1.5 µs however little it encodes, and a learner printing as
    fast as it can appends a hundred thousand lines a second.

    In the list's JSON the strings are separated by `","`. Inside a string a quote is
    escaped, so that sequence shows there only where a line ends with a comma (`","` is
    the line "," and `\\","` one ending with a quote and a comma). A block with a line
    that may end with a comma (`,",` or a last `,"` in the JSON), or one orjson refuses
    (a lone surrogate, which only a caller other than the log tee can pass), is written
    line by line."""
    try:
        strings = orjson.dumps(block.lines)[1:-1]
    except (orjson.JSONEncodeError, TypeError):
        strings = None
    if strings is None or b',",' in strings or strings.endswith(b',"'):
        return b"".join(_encode(block.ts, line) for line in block.lines)
    head = b'{"ts":' + orjson.dumps(block.ts) + b',"line":'
    return head + strings.replace(b'","', b'"}\n' + head + b'"') + b"}\n"


def _encode(ts: float, line: str) -> bytes:
    try:
        return orjson.dumps({"ts": ts, "line": line}) + b"\n"
    except orjson.JSONEncodeError:
        text = json.dumps({"ts": ts, "line": line}, ensure_ascii=False)
        return text.encode("utf-8", "surrogatepass") + b"\n"


def _parse(learner: int, raw: bytes, last_ts: float) -> LogRecord:
    """One stored line as a record. A line that is not a record (only a crashed writer
    leaves one) is returned as its raw text at the previous record's time, so nothing is
    hidden and a cursor can always move past it."""
    try:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:  # not UTF-8 (a surrogate _encode let through), or not JSON
            data = json.loads(raw.decode("utf-8", "surrogatepass"))
        return LogRecord(learner, float(data["ts"]), str(data["line"]))
    except (ValueError, KeyError, TypeError):
        return LogRecord(learner, last_ts, raw.decode("utf-8", "replace"))


def _find_newline(path: Path, start: int) -> tuple[bool, int]:
    """Whether the file holds a newline at or after `start`; else how far it was scanned."""
    with path.open("rb") as f:
        f.seek(start)
        while chunk := f.read(_CHUNK):
            if b"\n" in chunk:
                return True, start
            start += len(chunk)
    return False, start
