"""What learners report is checked as untrusted input (service.domain.reports), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from service.domain.lifecycle import LearnerObservation
from service.domain.reports import (
    MESSAGE_BYTES,
    MESSAGE_LIMIT,
    Malformed,
    Report,
    check_learner,
    check_report,
    clean_text,
)

T0 = 1_800_000_000.0  # the training's lifetime, as epoch seconds
WINDOW = (T0, T0 + 3600)


def learner(**fields: Any) -> LearnerObservation | Malformed:
    report: dict[str, Any] = {"learner_id": 3, "phase": "RUNNING"} | fields
    return check_learner(
        report["learner_id"],
        report["phase"],
        report.get("exit_code"),
        report.get("message"),
        report.get("phases", ()),
        window=WINDOW,
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, LearnerObservation(3, "RUNNING")),
        (
            {"phase": "FAILED", "exit_code": -9, "message": "killed"},
            LearnerObservation(3, "FAILED", -9, "killed"),
        ),
        ({"phase": "COMPLETED", "exit_code": 0}, LearnerObservation(3, "COMPLETED", 0)),
        ({"exit_code": 255}, LearnerObservation(3, "RUNNING", 255)),
        ({"exit_code": -255}, LearnerObservation(3, "RUNNING", -255)),
        # phases, as a mapping (status.json) or as pairs, come back as pairs in phase order
        (
            {"phases": {"RUNNING": T0 + 2, "DOWNLOADING": int(T0) + 1}},
            LearnerObservation(3, "RUNNING", phases=(("DOWNLOADING", T0 + 1), ("RUNNING", T0 + 2))),
        ),
        (
            {"phases": [["PENDING", T0]]},
            LearnerObservation(3, "RUNNING", phases=(("PENDING", T0),)),
        ),
        # messages are cleaned, not refused: control characters dropped, lines kept
        (
            {"message": "out\x00 of\x1b[31m memory\u202e\nline 2\t."},
            LearnerObservation(3, "RUNNING", message="out of[31m memory\nline 2\t."),
        ),
    ],
)
def test_good_reports_are_kept(fields: dict[str, Any], expected: LearnerObservation) -> None:
    assert learner(**fields) == expected


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        # the learner id
        ({"learner_id": "3"}, "a learner id is a str, not an integer"),
        ({"learner_id": True}, "a learner id is a bool, not an integer"),
        ({"learner_id": None}, "a learner id is null, not an integer"),
        # the phase
        ({"phase": "DONE"}, "phase 'DONE' is not one of PENDING, DOWNLOADING, RUNNING,"),
        ({"phase": "running"}, "phase 'running' is not one of"),
        ({"phase": "X" * 10_000_000}, "phase 'XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX…' is not"),
        ({"phase": "\x00\x1b[2J"}, "phase '[2J' is not one of"),
        ({"phase": None}, "phase is null, not text"),
        ({"phase": ["RUNNING"]}, "phase is a list, not text"),
        ({"phase": {"a": {"b": [1]}}}, "phase is a dict, not text"),
        # the exit code
        ({"exit_code": "x"}, "exit_code is a str, not an integer"),
        ({"exit_code": 1.0}, "exit_code is a float, not an integer"),
        ({"exit_code": float("nan")}, "exit_code is a float, not an integer"),
        ({"exit_code": False}, "exit_code is a bool, not an integer"),
        ({"exit_code": 2**80}, "exit_code is out of range (-255..255)"),
        ({"exit_code": 10**5000}, "exit_code is out of range (-255..255)"),
        ({"exit_code": 256}, "exit_code is out of range"),
        ({"exit_code": -256}, "exit_code is out of range"),
        # the message
        ({"message": 42}, "message is an int, not text"),
        ({"message": ["a"]}, "message is a list, not text"),
        (
            {"message": "m" * (10 * 1024 * 1024)},
            f"message is 10485760 characters long, more than a status report may hold "
            f"({MESSAGE_LIMIT})",
        ),
        # the phase times
        ({"phases": "RUNNING"}, "phases is a str, not a mapping of phase names to times"),
        ({"phases": 7}, "phases is an int, not a mapping"),
        ({"phases": {"RUNNING": "soon"}}, "the time of phase RUNNING is a str, not a number"),
        ({"phases": {"RUNNING": None}}, "the time of phase RUNNING is null, not a number"),
        ({"phases": {"RUNNING": True}}, "the time of phase RUNNING is a bool, not a number"),
        ({"phases": {"RUNNING": float("nan")}}, "the time of phase RUNNING is not a finite"),
        ({"phases": {"RUNNING": float("inf")}}, "the time of phase RUNNING is not a finite"),
        ({"phases": {"RUNNING": -1.0}}, "the time of phase RUNNING lies outside the training's"),
        ({"phases": {"RUNNING": 1e300}}, "the time of phase RUNNING lies outside"),
        ({"phases": {"RUNNING": 10**400}}, "the time of phase RUNNING lies outside"),
        ({"phases": {"RUNNING": T0 + 3601}}, "the time of phase RUNNING lies outside"),
        ({"phases": {"RUNNING": T0 - 1}}, "the time of phase RUNNING lies outside"),
        ({"phases": {"BOGUS": T0}}, "phases names 'BOGUS', which is not a learner phase"),
        ({"phases": {1: T0}}, "phases names a phase by an int, not text"),
        ({"phases": [("RUNNING", T0), ("RUNNING", T0)]}, "phases names RUNNING twice"),
        ({"phases": [("RUNNING", T0, 1)]}, "phases is not a mapping of phase names to times"),
        ({"phases": ["RUNNING"]}, "phases is not a mapping of phase names to times"),
        ({"phases": [("RUNNING", T0)] * 100_000}, "phases has 100000 entries; there are 8"),
    ],
)
def test_malformed_reports_say_why(fields: dict[str, Any], reason: str) -> None:
    result = learner(**fields)
    assert isinstance(result, Malformed), result
    assert result.reason.startswith(reason), result.reason
    assert len(result.message) < 300
    if "learner_id" not in fields:
        assert result.message.startswith("learner 3 sent a malformed status report: ")


def test_long_messages_are_cut_to_the_cap_on_a_character_boundary() -> None:
    message = "é" * MESSAGE_LIMIT  # 2 bytes each: twice the cap in bytes
    result = learner(message=message)
    assert isinstance(result, LearnerObservation) and result.message is not None
    assert len(result.message.encode()) <= MESSAGE_BYTES
    assert result.message.endswith("…") and result.message.startswith("éé")
    assert clean_text("short") == "short"
    assert clean_text("x" * MESSAGE_BYTES) == "x" * MESSAGE_BYTES
    assert clean_text("x" * (MESSAGE_BYTES + 1)).endswith("…")
    # a lone surrogate (valid JSON "\ud800") cannot be stored as UTF-8: dropped
    assert clean_text("a\ud800b") == "ab"


def report(learners: object, primaries: object = (1, 2), notes: object = ()) -> object:
    return check_report(learners, primaries, notes, learner_ids=[1, 2], window=WINDOW)


def two(*phases: str) -> tuple[LearnerObservation, ...]:
    return tuple(LearnerObservation(i, p) for i, p in enumerate(phases, 1))


def test_a_good_report_comes_back_in_learner_order_with_clean_notes() -> None:
    got = report(tuple(reversed(two("RUNNING", "PENDING"))), [2], ["note\x07 one"])
    assert got == Report(two("RUNNING", "PENDING"), (2,), ("note one",))


@pytest.mark.parametrize(
    ("learners", "primaries", "notes", "message"),
    [
        (
            (*two("RUNNING", "RUNNING"), LearnerObservation(7, "COMPLETED", 0)),
            (1, 2),
            (),
            "the status report of this training is malformed: it names learner 7, which this "
            "training does not have",
        ),
        (
            (*two("RUNNING", "RUNNING"), LearnerObservation(2, "COMPLETED", 0)),
            (1, 2),
            (),
            "the status report of this training is malformed: it names learner 2 twice",
        ),
        (
            two("RUNNING"),
            (1,),
            (),
            "the status report of this training is malformed: it has no status for learner 2",
        ),
        (
            (LearnerObservation(1, "RUNNING"), LearnerObservation(2, "RUNNING", "x")),  # type: ignore[arg-type]
            (1, 2),
            (),
            "learner 2 sent a malformed status report: exit_code is a str, not an integer",
        ),
        ("garbage", (1,), (), "malformed: the learners are a str, not a list"),
        ({"1": "RUNNING"}, (1,), (), "malformed: the learners are a dict, not a list"),
        (None, (1,), (), "malformed: the learners are null, not a list"),
        ([{"learner_id": 1}], (1,), (), "malformed: a learner's report is a dict"),
        (two("RUNNING", "RUNNING"), (), (), "malformed: it names no primary learner"),
        (two("RUNNING", "RUNNING"), None, (), "malformed: the primary learners are null"),
        (two("RUNNING", "RUNNING"), (3,), (), "a primary learner is not a learner of this"),
        (two("RUNNING", "RUNNING"), ("1",), (), "a primary learner is not a learner of this"),
        (two("RUNNING", "RUNNING"), (1, 1), (), "it names a primary learner twice"),
        (two("RUNNING", "RUNNING"), (1,), "note", "its notes are not a list of text"),
        (two("RUNNING", "RUNNING"), (1,), (1,), "its notes are not a list of text"),
    ],
)
def test_a_report_that_does_not_match_the_training_is_malformed(
    learners: object, primaries: object, notes: object, message: str
) -> None:
    got = report(learners, primaries, notes)
    assert isinstance(got, Malformed), got
    assert message in got.message, got.message
