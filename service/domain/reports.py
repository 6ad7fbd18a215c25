"""What a learner reports about itself is untrusted input (pure).

A learner runs the user's code, and that code can write whatever it likes where the
learner wrapper writes its status; a backend passes it on. Before the monitor records a
report or lets `service.domain.lifecycle` judge it, the report is checked here: each
learner's phase is one of the learner phases, its exit code an integer in -255..255 (or
none), its message text (cut to MESSAGE_BYTES, control characters dropped), its phase times
finite numbers within the training's lifetime; and the report as a whole names every
learner of the training exactly once, and nothing else. Anything else is a `Malformed`
report, with a reason a user can read; the training it came from fails, and no other
training notices.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TypeGuard

from service.domain.lifecycle import LearnerObservation

# PENDING..HALTED as the learner wrapper reports them; LOST is what a backend reports of a
# learner that is gone without saying so.
LEARNER_PHASES = (
    "PENDING",
    "DOWNLOADING",
    "RUNNING",
    "STORING",
    "COMPLETED",
    "FAILED",
    "HALTED",
    "LOST",
)
# Exit codes as a shell and Python's subprocess show them (negative: killed by a signal).
EXIT_CODE_MIN, EXIT_CODE_MAX = -255, 255
# A message is kept up to this many bytes of UTF-8 (the rest is cut, marked with "…") ...
MESSAGE_BYTES = 4096
# ... but one longer than this many characters is no status message: the report is refused.
MESSAGE_LIMIT = 64 * 1024
# A backend's notes on a training: at most this many are kept.
NOTES_LIMIT = 16
# How much of a refused value a reason quotes.
_EXCERPT = 40
# Kept although they are control characters: a message may have several lines.
_KEPT_CONTROLS = frozenset("\n\t")
# Control (Cc), format (Cf: bidirectional overrides, zero-width characters) and surrogate
# (Cs: not encodable as UTF-8, refused by PostgreSQL) characters are dropped.
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})


@dataclass(frozen=True)
class Malformed:
    """A report that cannot be trusted, and why."""

    reason: str
    learner_id: int | None = None  # the learner it came from, when that much is known

    @property
    def message(self) -> str:
        """What the training's status message says."""
        if self.learner_id is None:
            return f"the status report of this training is malformed: {self.reason}"
        return f"learner {self.learner_id} sent a malformed status report: {self.reason}"


@dataclass(frozen=True)
class Report:
    """A checked report on a training: one observation per learner, in learner order."""

    learners: tuple[LearnerObservation, ...]
    primaries: tuple[int, ...]
    notes: tuple[str, ...] = ()


def clean_text(text: str, limit: int = MESSAGE_BYTES) -> str:
    """`text` without control, format and surrogate characters (newlines and tabs are kept),
    cut to at most `limit` bytes of UTF-8, ending in "…" when it was cut."""
    head = text[: limit + 1]  # no character is less than a byte: enough to decide
    kept = "".join(
        c for c in head if c in _KEPT_CONTROLS or unicodedata.category(c) not in _DROPPED_CATEGORIES
    )
    encoded = kept.encode()
    if len(encoded) <= limit and len(head) == len(text):
        return kept
    marker = "…".encode()
    return encoded[: limit - len(marker)].decode(errors="ignore") + "…"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _excerpt(value: str) -> str:
    return f"'{clean_text(value, _EXCERPT)}'"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_learner(
    learner_id: object,
    phase: object,
    exit_code: object = None,
    message: object = None,
    phases: object = (),
    *,
    window: tuple[float, float],
) -> LearnerObservation | Malformed:
    """One learner's report as a `LearnerObservation` with clean fields, or `Malformed`.

    `phases` maps phase names to the time the learner entered each (epoch seconds), as a
    mapping or as (name, time) pairs; each time must lie in `window` (earliest, latest).
    """
    if not _is_int(learner_id):
        return Malformed(f"a learner id is {_kind(learner_id)}, not an integer")
    lid = learner_id

    if not isinstance(phase, str):
        return Malformed(f"phase is {_kind(phase)}, not text", lid)
    if phase not in LEARNER_PHASES:
        return Malformed(f"phase {_excerpt(phase)} is not one of {', '.join(LEARNER_PHASES)}", lid)

    if exit_code is not None:
        if not _is_int(exit_code):
            return Malformed(f"exit_code is {_kind(exit_code)}, not an integer", lid)
        if not EXIT_CODE_MIN <= exit_code <= EXIT_CODE_MAX:
            return Malformed(f"exit_code is out of range ({EXIT_CODE_MIN}..{EXIT_CODE_MAX})", lid)

    text: str | None = None
    if message is not None:
        if not isinstance(message, str):
            return Malformed(f"message is {_kind(message)}, not text", lid)
        if len(message) > MESSAGE_LIMIT:
            return Malformed(
                f"message is {len(message)} characters long, more than a status report may "
                f"hold ({MESSAGE_LIMIT})",
                lid,
            )
        text = clean_text(message)

    times = _check_phases(phases, window)
    if isinstance(times, str):
        return Malformed(times, lid)
    return LearnerObservation(lid, phase, exit_code, text, times)


def _check_phases(
    phases: object, window: tuple[float, float]
) -> tuple[tuple[str, float], ...] | str:
    """The phase times as (name, time) pairs in phase order, or why they are refused."""
    if isinstance(phases, Mapping):
        pairs: list[object] = list(phases.items())
    elif isinstance(phases, list | tuple):
        pairs = list(phases)
    else:
        return f"phases is {_kind(phases)}, not a mapping of phase names to times"
    if len(pairs) > len(LEARNER_PHASES):
        return f"phases has {len(pairs)} entries; there are {len(LEARNER_PHASES)} phases"
    earliest, latest = window
    times: dict[str, float] = {}
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            return "phases is not a mapping of phase names to times"
        name, at = pair
        if not isinstance(name, str):
            return f"phases names a phase by {_kind(name)}, not text"
        if name not in LEARNER_PHASES:
            return f"phases names {_excerpt(name)}, which is not a learner phase"
        if name in times:
            return f"phases names {name} twice"
        if not (_is_int(at) or isinstance(at, float)):
            return f"the time of phase {name} is {_kind(at)}, not a number"
        if isinstance(at, float) and not math.isfinite(at):
            return f"the time of phase {name} is not a finite number"
        # Compared before any conversion: an int too large for a float is out of range too.
        if not earliest <= at <= latest:
            return f"the time of phase {name} lies outside the training's lifetime"
        times[name] = float(at)
    return tuple((name, times[name]) for name in LEARNER_PHASES if name in times)


def check_report(
    learners: object,
    primaries: object,
    notes: object = (),
    *,
    learner_ids: Collection[int],
    window: tuple[float, float],
) -> Report | Malformed:
    """A backend's observation of a training whose learners are `learner_ids`, checked:
    every learner of the training reported once (`check_learner`, which takes a
    `LearnerObservation` whose fields may hold anything), no other; primaries a non-empty
    set of those learners; notes text."""
    if not isinstance(learners, list | tuple):
        return Malformed(f"the learners are {_kind(learners)}, not a list")
    known = set(learner_ids)
    seen: dict[int, LearnerObservation] = {}
    for raw in learners:
        if not isinstance(raw, LearnerObservation):
            return Malformed(f"a learner's report is {_kind(raw)}")
        lid = raw.learner_id
        if _is_int(lid) and lid not in known:
            return Malformed(f"it names learner {lid}, which this training does not have")
        if _is_int(lid) and lid in seen:
            return Malformed(f"it names learner {lid} twice")
        checked = check_learner(
            lid, raw.phase, raw.exit_code, raw.message, raw.phases, window=window
        )
        if isinstance(checked, Malformed):
            return checked
        seen[checked.learner_id] = checked
    missing = sorted(known - seen.keys())
    if missing:
        return Malformed(f"it has no status for learner {missing[0]}")

    if not isinstance(primaries, list | tuple):
        return Malformed(f"the primary learners are {_kind(primaries)}, not a list")
    if not primaries:
        return Malformed("it names no primary learner")
    for p in primaries:
        if not _is_int(p) or p not in known:
            return Malformed("a primary learner is not a learner of this training")
    if len(set(primaries)) != len(primaries):
        return Malformed("it names a primary learner twice")

    if not isinstance(notes, list | tuple) or not all(isinstance(n, str) for n in notes):
        return Malformed("its notes are not a list of text")
    kept = tuple(clean_text(n) for n in notes[:NOTES_LIMIT])

    return Report(
        learners=tuple(seen[lid] for lid in sorted(seen)),
        primaries=tuple(primaries),
        notes=kept,
    )
