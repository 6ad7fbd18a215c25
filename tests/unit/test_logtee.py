"""The log tee under a learner printing as fast as it can: every line reaches the live log
store and training-log.txt, complete and in order (what benchmarks/log_throughput.py
measures the speed of)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from service.logs import LogStore, all_records
from service.logs.base import LogRecord, iso_utc
from worker.learner import logtee
from worker.learner.logtee import LogTee

LINES = 100_000
PRINTER = """
import sys
text = "x" * 90
for i in range(int(sys.argv[1])):
    print(f"{i:08d} {text}")
"""


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
    proc = subprocess.Popen(
        [sys.executable, str(script), str(LINES)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    tee.start(os.dup(proc.stdout.fileno()))
    proc.stdout.close()
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

    def append(self, training_id: str, records: Sequence[LogRecord]) -> None:
        self.calls += 1
        self.release.wait(120)
        self.records += records


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
    proc = subprocess.Popen(
        [sys.executable, str(script), str(LINES)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    tee.start(os.dup(proc.stdout.fileno()))
    proc.stdout.close()
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
