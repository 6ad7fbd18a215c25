"""Users' metric regexes, compiled with RE2: the one rule for what a metric pattern is; and
the document in which learners store the scalars of their TensorBoard event files.

Kept apart from the manifest so the learner and the log readers use it without importing
the manifest's schema (pydantic).
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple, Protocol, cast

import re2


class MetricMatch(Protocol):
    def group(self, index: int, /) -> str | None: ...


class MetricPattern(Protocol):
    """An evaluation metric's regex, compiled (see `metric_pattern`)."""

    @property
    def groups(self) -> int: ...

    def search(self, text: str, /) -> MetricMatch | None: ...


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused regex is the user's error, not the server's


def metric_pattern(regex: str) -> MetricPattern:
    """An evaluation metric's regex compiled with RE2, which matches in time linear in the
    line whatever the pattern (no backtracking), so no regex can stall the service.

    RE2 takes Python's syntax (named groups included) except what needs backtracking:
    backreferences and lookaround. Raises ValueError, saying why, for a regex it refuses.
    """
    try:
        return cast(MetricPattern, re2.compile(regex, _RE2_OPTIONS))
    except re2.error as e:
        reason = e.args[0] if e.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(
            f"does not compile: {reason} (metric regexes run on RE2, which has no "
            "backreferences or lookaround)"
        ) from None


# -- TensorBoard scalars -----------------------------------------------------------------
#
# For a training whose manifest has `evaluation_metrics: {type: tensorboard}`, each learner's
# wrapper reads the scalars of its TensorBoard event files (worker.learner.logdir) and
# stores them as one JSON document (keys.tensorboard_metrics_key), which the API serves as
# the training's metrics:
#   {"format": 1, "learner": <i>, "truncated": <bool>,
#    "metrics": {"<run>/<tag>": [[<step>, <wall time>, <value>], ...], ...}}

TENSORBOARD_FORMAT = 1
# Most points a learner stores (all its metrics together); later ones are dropped and the
# document says `truncated`.
MAX_TENSORBOARD_POINTS = 50_000
# Longer metric names are not stored.
MAX_TENSORBOARD_NAME_CHARS = 256
# The most bytes of one learner's document the API reads: MAX_TENSORBOARD_POINTS points
# of the longest names fit well below it.
MAX_TENSORBOARD_DOCUMENT_BYTES = 32 * 1024 * 1024


class TensorBoardPoint(NamedTuple):
    step: int
    wall_time: float
    value: float


def tensorboard_metric_name(run: str, tag: str) -> str:
    """A scalar's metric name: `<run>/<tag>`, the run being its event file's directory
    below LOG_DIR (the tag alone for a file at its top), as TensorBoard names runs."""
    return f"{run}/{tag}" if run else tag


def parse_tensorboard_document(data: bytes) -> dict[str, list[TensorBoardPoint]]:
    """The metric points of one learner's stored document, checked field by field; raises
    ValueError saying what is wrong with one that is not as TENSORBOARD_FORMAT writes it."""
    if len(data) > MAX_TENSORBOARD_DOCUMENT_BYTES:
        raise ValueError(f"is larger than {MAX_TENSORBOARD_DOCUMENT_BYTES} bytes")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"is not JSON: {e}") from None
    if not isinstance(document, dict) or document.get("format") != TENSORBOARD_FORMAT:
        raise ValueError(f"is not a format {TENSORBOARD_FORMAT} metrics document")
    metrics = document.get("metrics")
    if not isinstance(metrics, dict):
        raise ValueError("has no metrics mapping")
    result: dict[str, list[TensorBoardPoint]] = {}
    for name, points in metrics.items():
        if not isinstance(points, list):
            raise ValueError(f"metric {name!r} is not a list of points")
        parsed = []
        for point in points:
            if (
                not isinstance(point, list)
                or len(point) != 3
                or not isinstance(point[0], int)
                or not all(isinstance(x, int | float) for x in point[1:])
                or any(isinstance(x, bool) for x in point)
                or not all(math.isfinite(x) for x in point[1:])
            ):
                raise ValueError(f"metric {name!r} has a point that is not [step, time, value]")
            parsed.append(TensorBoardPoint(point[0], float(point[1]), float(point[2])))
        result[name] = parsed
    return result
