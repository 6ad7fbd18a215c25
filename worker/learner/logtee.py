"""The log tee: a command's output, line by line, to the live log store and a local file."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from pathlib import Path

from service.logs.base import LogBlock, LogStore, iso_utc
from service.storage import keys
from worker.learner.logmetrics import LogMetrics

MAX_LINE_BYTES = 64 * 1024  # longer lines are split into records of at most this size
# Read a block at a time, from a pipe made this large where the kernel allows (an
# unprivileged process may grow a pipe to /proc/sys/fs/pipe-max-size, 1 MiB by default):
# the command writes that far ahead of the tee before it would wait.
_READ_CHUNK = 1024 * 1024
_PIPE_SIZE = 1024 * 1024
# After a read of less than _GATHER_BELOW bytes, the reader waits _GATHER_SECONDS before
# the next: a line reaches the log that much later at most, and the command never waits
# (the pipe holds _PIPE_SIZE; a command writes at most a few hundred KiB in that time).
_GATHER_BELOW = 64 * 1024
_GATHER_SECONDS = 0.002
# Lines read but not yet taken by the live log store. Past it lines are not queued for
# the store (counted, and a marker says so once it takes lines again): the command never
# waits for the store. training-log.txt has every line.
_MAX_PENDING_BYTES = 16 * 1024 * 1024


def split_pieces(buffer: bytes) -> tuple[list[bytes], list[int], bytes]:
    """Complete lines of `buffer` (without their newline), the indexes of the pieces that
    do not end their line, and the incomplete rest.

    A line longer than MAX_LINE_BYTES is cut into pieces of at most that size, at a UTF-8
    character boundary where there is one nearby, so the rest never exceeds it; the next
    piece, or the rest, goes on with it. Usually there is no cut.
    """
    lines: list[bytes] = []
    cuts: list[int] = []
    start = 0
    while True:
        newline = buffer.find(b"\n", start, start + MAX_LINE_BYTES + 1)
        if newline != -1:
            lines.append(buffer[start:newline])
            start = newline + 1
        elif len(buffer) - start > MAX_LINE_BYTES:
            cut = start + MAX_LINE_BYTES
            while cut > start + MAX_LINE_BYTES - 3 and buffer[cut] & 0xC0 == 0x80:
                cut -= 1  # do not split a multi-byte character
            cuts.append(len(lines))
            lines.append(buffer[start:cut])
            start = cut
        else:
            return lines, cuts, buffer[start:]


def split_text(buffer: bytes) -> tuple[list[str], list[int], bytes]:
    """As `split_pieces`, each piece decoded as the log holds it (UTF-8, an invalid byte
    replaced, a carriage return ending it dropped).

    Most output takes one decode of the block's whole lines and one split of the text: a
    newline is never part of a multi-byte character, so decoding the lines together
    replaces the same bytes as decoding each alone. Only where a line may be longer than
    MAX_LINE_BYTES (more than a quarter of it in characters) is the block cut as bytes."""
    end = buffer.rfind(b"\n") + 1
    if end and len(buffer) - end <= MAX_LINE_BYTES:
        text = buffer[: end - 1].decode("utf-8", "replace")
        lines = text.split("\n")
        if max(map(len, lines)) <= MAX_LINE_BYTES // 4:
            if "\r" in text:
                lines = [line.removesuffix("\r") for line in lines]
            return lines, [], buffer[end:]
    pieces, cuts, rest = split_pieces(buffer)
    return [_text(piece) for piece in pieces], cuts, rest


def _text(piece: bytes) -> str:
    return piece.removesuffix(b"\r").decode("utf-8", "replace")


def gap_marker(missing: int) -> str:
    """The line the live log gets once the log store is back after it missed lines."""
    return (
        f"[dlaas] {missing} log line(s) could not be sent to the live log while it was "
        f"unavailable; {keys.LEARNER_LOG_NAME} in the results has them all"
    )


def dropped_marker(missing: int) -> str:
    """The line the live log gets where it skipped lines the store could not keep up with."""
    return (
        f"[dlaas] {missing} log line(s) were not sent to the live log: the learner printed "
        f"faster than the log store took them; {keys.LEARNER_LOG_NAME} in the results has "
        "them all"
    )


def truncated_marker(max_bytes: int) -> str:
    """The line that ends a learner's log cut at its cap."""
    return f"[dlaas] log truncated: the plan allows {max_bytes} bytes of log per training learner"


class LogTee:
    """Reads a command's output and writes each line to a log store and a local file.

    One thread reads the pipe a block at a time (up to _READ_CHUNK, the pipe grown to
    _PIPE_SIZE) and cuts lines, stamping the block's lines with the time it was read; it
    appends them to the local file with one write and queues them for the store as one
    `LogBlock` (never an object per line). Another sends whatever has accumulated to the
    store as one batch (one round trip), as soon as there is something, so lines reach the
    store within the store's own latency and batches grow only when the store is slower
    than the command. Nothing waits for the store: past _MAX_PENDING_BYTES queued, lines
    are not queued but counted, and the live log gets a marker line saying how many it
    misses (as when the store is down).

    With `metrics`, each block read is then handed to it (the training's metric regexes,
    searched in a thread of its own: `LogMetrics.feed` never waits), the lines the tee cut
    marked as such so a metric is found in the whole line.
    """

    def __init__(
        self,
        learner: int,
        training_id: str,
        store: LogStore,
        local_file: Path,
        *,
        max_bytes: int | None = None,
        metrics: LogMetrics | None = None,
    ) -> None:
        self._fd = -1
        self._metrics = metrics
        # Bytes of lines (each with its newline) this learner may log; past them one
        # marker line, then the rest is read and dropped.
        self._max_bytes = max_bytes
        self._logged = 0
        self._truncated = False
        self._learner = learner
        self._training_id = training_id
        self._store = store
        self._local = os.open(local_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        # The local file is written by the reader; close() closes it under this lock.
        self._local_lock = threading.Lock()
        self._local_open = True
        # Lines the store's queue had no room for, not yet marked in it.
        self._dropped = 0
        self._cond = threading.Condition()
        self._pending: list[LogBlock] = []
        self._pending_bytes = 0
        self._eof = False
        self._closed = False
        self._warned: set[str] = set()
        # Lines the live log store missed since it last took a batch (its gap so far).
        self._unsent = 0
        self._reader = threading.Thread(target=self._read, name="log-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="log-writer", daemon=True)

    def start(self, fd: int) -> None:
        """Start reading `fd` (the tee owns it from now on and closes it at its end)."""
        self._fd = fd
        with contextlib.suppress(OSError):  # not a pipe, or the kernel's limit is lower
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        if self._metrics is not None:
            self._metrics.start()
        self._reader.start()
        self._writer.start()

    def close(self, timeout: float) -> None:
        """Wait up to `timeout` s for the output to end, then write what was read, and
        (up to `timeout` s more) search it for metrics; idempotent."""
        started = self._reader.ident is not None
        if started:
            self._reader.join(timeout)
        with self._cond:
            self._eof = self._closed = True  # lines of a straggler holding the pipe are dropped
            self._cond.notify_all()
        if started:
            self._writer.join()
        if self._metrics is not None:  # what was written is searched before it is stored
            self._metrics.close(timeout)
        with self._local_lock, contextlib.suppress(OSError):
            self._local_open = False  # a straggling reader writes no more
            os.close(self._local)

    def _read(self) -> None:
        rest = b""
        try:
            while chunk := os.read(self._fd, _READ_CHUNK):
                rest = self._take(rest + chunk)
                if len(chunk) < _GATHER_BELOW:
                    # Let the pipe gather more before the next read: a command printing
                    # a line at a time would otherwise be read a few lines at a time, each
                    # read waking this thread (and the store's) for a handful of lines.
                    time.sleep(_GATHER_SECONDS)
            if rest:
                self._take(rest, final=True)
        except OSError as e:
            self._warn("read", f"reading the command's output failed: {e}")
        finally:
            # Closed here, not by close(): were it closed while this thread still reads, the
            # number could be reused and this thread would read someone else's file.
            os.close(self._fd)
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _take(self, buffer: bytes, *, final: bool = False) -> bytes:
        """The whole lines of `buffer` (all of it if `final`) logged; returns the rest."""
        if self._truncated or self._closed:  # read and dropped
            return b""
        lines, cuts, rest = ([_text(buffer)], [], b"") if final else split_text(buffer)
        if not lines:
            return rest
        # What the lines count against the cap: each piece and one byte for its end.
        taken = len(buffer) - len(rest)
        counted = taken + len(cuts) + final
        if self._max_bytes is not None and self._logged + counted > self._max_bytes:
            return self._take_to_cap(buffer, self._max_bytes, final=final)
        self._logged += counted
        self._put(lines, counted - len(lines), cuts)
        return rest

    def _take_to_cap(self, buffer: bytes, max_bytes: int, *, final: bool) -> bytes:
        """`_take` near the log's cap: line by line, the lines within it, then the marker
        line that ends the log."""
        pieces, cuts, rest = ([buffer], [], b"") if final else split_pieces(buffer)
        lines: list[str] = []
        size = 0
        for piece in pieces:
            if self._logged + len(piece) + 1 > max_bytes:
                self._truncated = True
                break
            self._logged += len(piece) + 1
            lines.append(_text(piece))
            size += len(piece)
        cuts = [i for i in cuts if i < len(lines)]
        self._put(lines, size, cuts, truncated_marker(max_bytes) if self._truncated else None)
        return rest

    def _put(self, lines: list[str], size: int, cuts: list[int], marker: str | None = None) -> None:
        """One block's lines (`size` bytes without their newlines) and the marker line that
        ends the log, if it ends here: to the local file, to the metrics (not the marker),
        and queued for the store (or counted as dropped when its queue is full)."""
        now = time.time()
        blocks = [LogBlock(self._learner, now, lines)] if lines else []
        if marker is not None:
            blocks.append(LogBlock(self._learner, now, [marker]))
        if not blocks:
            return
        self._write_local(now, [*lines, marker] if marker is not None else lines)
        if self._metrics is not None and lines:
            self._metrics.feed(now, lines, size, cuts)
        count = len(lines) + (marker is not None)
        with self._cond:
            if self._closed:
                return
            if self._pending_bytes > _MAX_PENDING_BYTES:
                self._dropped += count
                return
            if self._dropped:
                gap = LogBlock(self._learner, now, [dropped_marker(self._dropped)])
                self._pending.append(gap)
                self._dropped = 0
            self._pending += blocks
            self._pending_bytes += size
            self._cond.notify_all()

    def _write_local(self, ts: float, lines: list[str]) -> None:
        text = _local_text(ts, lines)
        with self._local_lock:
            if not self._local_open:
                return
            try:
                while text:
                    text = text[os.write(self._local, text) :]
            except OSError as e:
                self._warn("file", f"writing {keys.LEARNER_LOG_NAME} failed: {e}")

    def _write(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._eof:
                    self._cond.wait()
                batch, self._pending, self._pending_bytes = self._pending, [], 0
                if not batch and self._dropped:  # the end: say what the live log missed
                    marker = dropped_marker(self._dropped)
                    batch = [LogBlock(self._learner, time.time(), [marker])]
                    self._dropped = 0
            if not batch:
                if self._unsent:  # the store missed the last lines: try once more to say so
                    self._send([])
                return
            self._send(batch)

    def _send(self, batch: list[LogBlock]) -> None:
        """Append the batch to the live log store. Lines it misses (the store is down or
        restarting) are counted, and the first batch it takes again starts with a marker
        saying how many are missing there, so a gap in the live log is never silent."""
        blocks = batch
        if self._unsent:
            ts = batch[0].ts if batch else time.time()
            blocks = [LogBlock(self._learner, ts, [gap_marker(self._unsent)]), *batch]
        try:
            self._store.append_blocks(self._training_id, blocks)
        except Exception as e:  # the live log is a convenience; training-log.txt is the record
            self._unsent += sum(len(block.lines) for block in batch)
            self._warn("store", f"the live log store is unavailable, lines are missing: {e}")
            return
        if self._unsent:
            self._unsent = 0
            self._warned.discard("store")  # a later outage is reported again

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            print(f"learner wrapper: {message}", file=sys.stderr, flush=True)


def _local_text(ts: float, lines: list[str]) -> bytes:
    """The lines as training-log.txt holds them: `<iso time> <line>` each, all with the
    stamp of the read that got them, formatted once."""
    stamp = iso_utc(ts) + " "
    return (stamp + ("\n" + stamp).join(lines) + "\n").encode("utf-8", "replace")
