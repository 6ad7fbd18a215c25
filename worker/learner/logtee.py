"""The log tee: a command's output, line by line, to the live log store and a local file."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from pathlib import Path

from service.logs.base import LogRecord, LogStore, iso_utc
from service.storage import keys
from worker.learner.logmetrics import LogMetrics

MAX_LINE_BYTES = 64 * 1024  # longer lines are split into records of at most this size
# Read a block at a time, from a pipe made this large where the kernel allows (an
# unprivileged process may grow a pipe to /proc/sys/fs/pipe-max-size, 1 MiB by default):
# the command writes that far ahead of the tee before it would wait.
_READ_CHUNK = 1024 * 1024
_PIPE_SIZE = 1024 * 1024
# Lines read but not yet taken by the live log store. Past it lines are not queued for
# the store (counted, and a marker says so once it takes lines again): the command never
# waits for the store. training-log.txt has every line.
_MAX_PENDING_BYTES = 16 * 1024 * 1024


def split_lines(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines of `buffer` (without their newline) and the incomplete rest.

    A line longer than MAX_LINE_BYTES is cut into pieces of at most that size, at a UTF-8
    character boundary where there is one nearby, so the rest never exceeds it.
    """
    return _split(buffer, None)


def split_pieces(buffer: bytes) -> tuple[list[bytes], list[int], bytes]:
    """As `split_lines`, and the indexes of the pieces that do not end their line (a line
    longer than MAX_LINE_BYTES was cut there, and the next piece, or the rest, goes on
    with it): usually none."""
    cuts: list[int] = []
    lines, rest = _split(buffer, cuts)
    return lines, cuts, rest


def _split(buffer: bytes, cuts: list[int] | None) -> tuple[list[bytes], bytes]:
    lines: list[bytes] = []
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
            if cuts is not None:
                cuts.append(len(lines))
            lines.append(buffer[start:cut])
            start = cut
        else:
            return lines, buffer[start:]


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
    _PIPE_SIZE) and cuts lines, stamping each with the time it was read; it appends the
    block's lines to the local file with one write and queues them for the store. Another
    sends whatever has accumulated to the store as one batch (one round trip), as soon as
    there is something, so lines reach the store within the store's own latency and
    batches grow only when the store is slower than the command. Nothing waits for the
    store: past _MAX_PENDING_BYTES queued, lines are not queued but counted, and the live
    log gets a marker line saying how many it misses (as when the store is down).

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
        # The marker line that ends a truncated log (not the command's).
        self._marker: LogRecord | None = None
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
        self._pending: list[LogRecord] = []
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
            if self._metrics is None:
                while chunk := os.read(self._fd, _READ_CHUNK):
                    lines, rest = split_lines(rest + chunk)
                    self._put(lines)
            else:
                while chunk := os.read(self._fd, _READ_CHUNK):
                    lines, cuts, rest = split_pieces(rest + chunk)
                    self._put(lines, cuts)
            if rest:
                self._put([rest])
        except OSError as e:
            self._warn("read", f"reading the command's output failed: {e}")
        finally:
            # Closed here, not by close(): were it closed while this thread still reads, the
            # number could be reused and this thread would read someone else's file.
            os.close(self._fd)
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _put(self, lines: list[bytes], cuts: list[int] | None = None) -> None:
        """One block's lines: to the local file, to the metrics, and queued for the store
        (or counted as dropped when its queue is full)."""
        if self._closed:  # a straggler holding the pipe after close(): dropped
            return
        now = time.time()
        records: list[LogRecord] = []
        cut: list[LogRecord] = []
        size = 0
        marker = None
        for i, raw in enumerate(lines):
            if self._truncated:
                break
            if self._max_bytes is not None and self._logged + len(raw) + 1 > self._max_bytes:
                self._truncated = True
                marker = self._marker = LogRecord(
                    self._learner, now, truncated_marker(self._max_bytes)
                )
                records.append(marker)
                break
            self._logged += len(raw) + 1
            line = raw.removesuffix(b"\r").decode("utf-8", "replace")
            record = LogRecord(self._learner, now, line)
            records.append(record)
            size += len(raw)
            if cuts and i in cuts:
                cut.append(record)
        if not records:
            return
        self._write_local(records)
        if self._metrics is not None:
            self._metrics.feed(records, size, cut, marker)
        with self._cond:
            if self._closed:
                return
            if self._pending_bytes > _MAX_PENDING_BYTES:
                self._dropped += len(records)
                return
            if self._dropped:
                gap = LogRecord(self._learner, now, dropped_marker(self._dropped))
                self._pending.append(gap)
                self._dropped = 0
            self._pending += records
            self._pending_bytes += size
            self._cond.notify_all()

    def _write_local(self, records: list[LogRecord]) -> None:
        text = _local_text(records)
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
                    batch = [LogRecord(self._learner, time.time(), dropped_marker(self._dropped))]
                    self._dropped = 0
            if not batch:
                if self._unsent:  # the store missed the last lines: try once more to say so
                    self._send([])
                return
            self._send(batch)

    def _send(self, batch: list[LogRecord]) -> None:
        """Append the batch to the live log store. Lines it misses (the store is down or
        restarting) are counted, and the first batch it takes again starts with a marker
        saying how many are missing there, so a gap in the live log is never silent."""
        records = batch
        if self._unsent:
            ts = batch[0].ts if batch else time.time()
            records = [LogRecord(self._learner, ts, gap_marker(self._unsent)), *batch]
        try:
            self._store.append(self._training_id, records)
        except Exception as e:  # the live log is a convenience; training-log.txt is the record
            self._unsent += len(batch)
            self._warn("store", f"the live log store is unavailable, lines are missing: {e}")
            return
        if self._unsent:
            self._unsent = 0
            self._warned.discard("store")  # a later outage is reported again

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            print(f"learner wrapper: {message}", file=sys.stderr, flush=True)


def _local_text(batch: list[LogRecord]) -> bytes:
    """The batch as training-log.txt holds it: `<iso time> <line>` per record. The lines
    of one read share its time stamp, so each distinct stamp is formatted once (formatting
    one per line was a third of the tee's time for a learner printing as fast as it can)."""
    parts: list[str] = []
    last_ts: float | None = None
    stamp = ""
    for record in batch:
        if record.ts != last_ts:
            last_ts, stamp = record.ts, iso_utc(record.ts) + " "
        parts += (stamp, record.line, "\n")
    return "".join(parts).encode("utf-8", "replace")
