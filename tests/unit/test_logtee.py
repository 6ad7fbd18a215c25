"""The log tee under a learner printing as fast as it can: every line reaches the live log
store and training-log.txt, complete and in order (what benchmarks/log_throughput.py
measures the speed of)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from service.logs import LogStore, all_records
from service.logs.base import LogBlock, LogRecord, iso_utc, records_of
from service.logs.files import FileLogStore
from worker.learner import logtee
from worker.learner.logtee import MAX_LINE_BYTES, LogTee, split_pieces, split_text

LINES = 100_000
PRINTER = """
import sys
text = "x" * 90
for i in range(int(sys.argv[1])):
    print(f"{i:08d} {text}")
"""


def tee_program(tee: LogTee, args: list[str]) -> subprocess.Popen[bytes]:
    """Python running `args`, unbuffered as learners run, its output read by `tee`."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    tee.start(os.dup(proc.stdout.fileno()))
    proc.stdout.close()
    return proc


def expected(lines: int) -> list[str]:
    return [f"{i:08d} {'x' * 90}" for i in range(lines)]


def test_every_line_of_a_fast_printer_arrives_in_order(log_store: LogStore, tmp_path: Path) -> None:
    """One write per line (PYTHONUNBUFFERED, as learners run), 100,000 of them: the tee
    reads them in many small pieces and writes them in batches of any size."""
    store = log_store
    training_id = f"test-{uuid.uuid4().hex}"
    local = tmp_path / "training-log.txt"
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    tee = LogTee(3, training_id, store, local)
    proc = tee_program(tee, [str(script), str(LINES)])
    try:
        assert proc.wait(timeout=120) == 0
        tee.close(timeout=60)
        records = list(all_records(store, training_id))
        assert [r.line for r in records] == expected(LINES)
        assert {r.learner for r in records} == {3}
        stamps = [r.ts for r in records]
        assert stamps == sorted(stamps)
        # training-log.txt: `<iso time> <line>`, each line with the stamp of its record.
        written = local.read_text().splitlines()
        assert [line.split(" ", 1)[1] for line in written] == expected(LINES)
        assert [line.split(" ", 1)[0] for line in written] == [iso_utc(r.ts) for r in records]
    finally:
        store.delete(training_id)


class StuckStore:
    """A live log store that takes its first batch only when `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.records: list[LogRecord] = []
        self.calls = 0

    def append_blocks(self, training_id: str, blocks: Sequence[LogBlock]) -> None:
        self.calls += 1
        self.release.wait(120)
        self.records += records_of(blocks)


def test_a_store_that_does_not_keep_up_never_holds_the_command_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is stuck while the learner prints 10 MB: the command ends regardless,
    training-log.txt has every line, and the live log has the lines it took, then a marker
    counting those it skipped, then the rest."""
    monkeypatch.setattr(logtee, "_MAX_PENDING_BYTES", 256 * 1024)
    store = StuckStore()
    local = tmp_path / "training-log.txt"
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    tee = LogTee(1, "t", store, local)  # type: ignore[arg-type]
    proc = tee_program(tee, [str(script), str(LINES)])
    try:
        assert proc.wait(timeout=120) == 0  # while the store is still stuck
        assert not store.release.is_set() and store.calls >= 1
    finally:
        store.release.set()
        tee.close(timeout=60)
    written = local.read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in written] == expected(LINES)
    lines = [r.line for r in store.records]
    markers = [i for i, line in enumerate(lines) if line.startswith("[dlaas] ")]
    assert markers, "the live log says that it misses lines"
    missing = sum(int(lines[i].split()[1]) for i in markers)
    assert "faster than the log store took them" in lines[markers[0]]
    sent = [line for line in lines if not line.startswith("[dlaas] ")]
    assert len(sent) + missing == LINES
    assert sent == sorted(sent)  # what it has is in order


def _pieces_decoded(buffer: bytes) -> tuple[list[str], list[int], bytes]:
    pieces, cuts, rest = split_pieces(buffer)
    return [p.removesuffix(b"\r").decode("utf-8", "replace") for p in pieces], cuts, rest


@pytest.mark.parametrize(
    "buffer",
    [
        b"a\nb\n",
        b"a\r\nb\r\nno end\r",
        b"carriage \r inside\n",
        b"caf\xc3\xa9\n\xc3",  # a character the next read completes
        b"cut \xe2\x82\nshort\n",  # an incomplete character before a newline
        b"\xff\xfe bad\n\xed\xa0\x80 surrogate\n",
        "é".encode() * 9000 + b"\n",  # 18,000 bytes: one decode
        "€".encode() * 20000 + b"\nz\n",  # 60,000 bytes in 20,000 characters: as bytes
        b"x" * (MAX_LINE_BYTES + 5),
        b"a\n" + b"x" * (2 * MAX_LINE_BYTES) + b"\nz\n",
        b"a\n" + "é".encode() * MAX_LINE_BYTES,  # the rest is longer than a line may be
        b"",
        b"no newline",
    ],
)
def test_split_text_is_each_piece_decoded(buffer: bytes) -> None:
    """The tee decodes a block's lines at once; the text is that of each piece decoded
    alone (an invalid byte replaced, a carriage return ending it dropped)."""
    assert split_text(buffer) == _pieces_decoded(buffer)


def test_split_text_of_random_output_is_each_piece_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logtee, "MAX_LINE_BYTES", 16)  # long lines are common here
    alphabet = [b"a", b"\n", b"\r", b"\xc3", b"\xa9", b"\xff", "€".encode(), b" "]
    chooser = random.Random(11)
    for _ in range(5000):
        buffer = b"".join(chooser.choice(alphabet) for _ in range(chooser.randint(0, 60)))
        assert split_text(buffer) == _pieces_decoded(buffer), buffer


class CountingStore(FileLogStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.blocks: list[LogBlock] = []

    def append_blocks(self, training_id: str, blocks: Sequence[LogBlock]) -> None:
        self.blocks += blocks
        super().append_blocks(training_id, blocks)


def test_a_fast_printer_is_read_in_few_large_blocks(tmp_path: Path) -> None:
    """After a short read the tee lets the pipe gather for _GATHER_SECONDS: a program
    printing a line per write is read a few hundred KiB at a time, not a few lines (each
    read costs the tee, and the store, a wake-up and a write)."""
    store = CountingStore(tmp_path / "logs")
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    tee = LogTee(1, "t", store, tmp_path / "training-log.txt")
    started = time.monotonic()
    proc = tee_program(tee, [str(script), str(LINES)])
    assert proc.wait(timeout=120) == 0
    tee.close(timeout=60)
    elapsed = time.monotonic() - started
    assert [line for b in store.blocks for line in b.lines] == expected(LINES)
    # Reads of at least _GATHER_BELOW bytes, and the others at most one per gathering.
    large = LINES * 100 // logtee._GATHER_BELOW
    assert len(store.blocks) <= large + elapsed / logtee._GATHER_SECONDS + 10
