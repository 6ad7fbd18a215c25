"""A TensorFlow 1.x script that needs porting is recognised in its output (the domain's
rule, service.domain.porting), table-tested, and the failure message says so
(worker.porting_notes, over a log store)."""

from __future__ import annotations

from typing import Any

import pytest

from service.db.models import Training
from service.domain.porting import PORTING_NOTES, porting_note, runs_tensorflow1_scripts
from service.logs.base import LogRecord, LogStoreUnavailable
from worker.porting_notes import with_porting_note

CONTRIB = "ModuleNotFoundError: No module named 'tensorflow.contrib'"
EXAMPLES = "ModuleNotFoundError: No module named 'tensorflow.examples'"
ATTRIBUTE = "AttributeError: module 'tensorflow' has no attribute 'contrib'"


@pytest.mark.parametrize(
    ("version", "lines", "module"),
    [
        ("1.5", ["Traceback (most recent call last):", CONTRIB], "tensorflow.contrib"),
        ("1.5", [f"process output: {EXAMPLES}"], "tensorflow.examples"),
        (
            "1.5",
            ["ModuleNotFoundError: No module named 'tensorflow.examples.tutorials'"],
            "tensorflow.examples.tutorials",
        ),
        ("1.5", [ATTRIBUTE], "tensorflow.contrib"),
        (
            "1.5",
            ["AttributeError: module 'tensorflow.compat.v1' has no attribute 'contrib'"],
            "tensorflow.contrib",
        ),
        # Not a 1.x version: TensorFlow 2 users know it has no contrib.
        ("2.21", [CONTRIB], None),
        # Other failures say nothing of porting.
        ("1.5", ["ModuleNotFoundError: No module named 'tensorflow_datasets'"], None),
        ("1.5", ["ValueError: bad input"], None),
        ("1.5", [], None),
    ],
)
def test_porting_notes_for_tensorflow1_imports(
    version: str, lines: list[str], module: str | None
) -> None:
    note = porting_note(version, lines)
    if module is None:
        assert note is None
        return
    assert note is not None
    assert f"imports {module}," in note
    assert PORTING_NOTES in note and "tf.compat.v1" in note


@pytest.mark.parametrize(("version", "yes"), [("1.5", True), ("1.15", True), ("2.21", False)])
def test_which_versions_run_tensorflow1_scripts(version: str, yes: bool) -> None:
    assert runs_tensorflow1_scripts(version) is yes


class Logs:
    def __init__(self, lines: list[str], fail: bool = False) -> None:
        self.lines, self.fail, self.reads = lines, fail, 0

    def read(self, training_id: str, cursor: str | None = None, limit: int = 10_000) -> Any:
        self.reads += 1
        if self.fail:
            raise LogStoreUnavailable("redis://x is down")
        return [LogRecord(2, 0.0, line) for line in self.lines[:limit]], "c"


def test_the_failure_message_gets_the_note() -> None:
    training = Training(id="t1", framework_version="1.5")
    logs = Logs(["starting", CONTRIB])
    message = with_porting_note(logs, training, "learner 2 exited with code 1")  # type: ignore[arg-type]
    assert message.startswith("learner 2 exited with code 1: the script imports tensorflow.contrib")
    assert PORTING_NOTES in message


def test_no_note_without_the_import_failure_or_the_log() -> None:
    training = Training(id="t1", framework_version="1.5")
    assert with_porting_note(Logs(["oops"]), training, "m") == "m"  # type: ignore[arg-type]
    assert with_porting_note(Logs([CONTRIB], fail=True), training, "m") == "m"  # type: ignore[arg-type]
    newer = Training(id="t2", framework_version="2.21")
    untouched = Logs([CONTRIB])
    assert with_porting_note(untouched, newer, "m") == "m"  # type: ignore[arg-type]
    assert untouched.reads == 0  # a 2.x training's log is not read
