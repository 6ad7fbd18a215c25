"""Users' metric regexes, compiled with RE2: the one rule for what a metric pattern is, and
how they are applied to log lines; and the documents in which learners store their
metrics: the scalars of their TensorBoard event files, or the points their regexes found in
their output.

Kept apart from the manifest so the learner and the log readers use it without importing
the manifest's schema (pydantic).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
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


def _document_metrics(data: bytes, version: int) -> dict[str, object]:
    """The `metrics` mapping of a stored metrics document (TensorBoard's or the log's: both
    are read at most MAX_TENSORBOARD_DOCUMENT_BYTES); ValueError if it is not one."""
    if len(data) > MAX_TENSORBOARD_DOCUMENT_BYTES:
        raise ValueError(f"is larger than {MAX_TENSORBOARD_DOCUMENT_BYTES} bytes")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"is not JSON: {e}") from None
    if not isinstance(document, dict) or document.get("format") != version:
        raise ValueError(f"is not a format {version} metrics document")
    metrics = document.get("metrics")
    if not isinstance(metrics, dict):
        raise ValueError("has no metrics mapping")
    return metrics


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
    metrics = _document_metrics(data, TENSORBOARD_FORMAT)
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


# -- Metrics from log lines ---------------------------------------------------------------
#
# For a training whose manifest lists `evaluation_metrics` regexes, each learner's wrapper
# applies them to its command's output as its log tee writes it (worker.learner.logmetrics)
# and stores the points as one JSON document (keys.log_metrics_key), which the API serves
# as the training's metrics; the log itself is never scanned to answer GET .../metrics:
#   {"format": 1, "learner": <i>, "truncated": <bool>, "skipped_lines": <n>,
#    "metrics": {"<name>": [[<step or null>, <time>, <value>], ...], ...}}
# `time` is when the wrapper read the line (the line's log time stamp); `step` the number
# after "step" in the same line.

LOG_METRICS_FORMAT = 1
# A line longer than this (in characters; the tee may have cut it into several records
# of at most MAX_LINE_BYTES) is searched in its first MAX_METRIC_LINE_CHARS only.
MAX_METRIC_LINE_CHARS = 1024 * 1024
# The largest step kept (a longer number is no step: the point has none).
_MAX_STEP_DIGITS = 18

_STEP = metric_pattern(r"(?i)step[ =:]+(\d+)")
# What in a regex may match a line alone but not among other lines: \A, \z, and flags
# that turn multi-line mode off (conservatively: any flag group that turns one off).
_WHOLE_TEXT = metric_pattern(r"\\[Az]|\(\?[a-zA-Z]*-")


class LogMetricPoint(NamedTuple):
    step: int | None
    wall_time: float
    value: float


def log_metric_cap(metric_count: int) -> int:
    """The most points one learner keeps of each of its `metric_count` metrics: an equal
    share of MAX_TENSORBOARD_POINTS, so one chatty metric cannot crowd out the others and
    a learner's document holds at most as many points as a TensorBoard one."""
    return MAX_TENSORBOARD_POINTS // max(1, metric_count)


class LogMetricExtractor:
    """The evaluation metrics of one learner's output, a line at a time (`feed`).

    `definitions` are the manifest's (name, regex) pairs. A regex RE2 refuses is left out
    and named in `refused` (the API answers such a training with a 409; the learner runs
    on). Per line, a metric's first match counts; its regex's first group (the whole match
    if it has none) is the value, skipped unless it is a finite float. All regexes are
    first tried together in one pass of an RE2 set, so a line costs one scan however many
    metrics there are (and a batch of lines with none in it, one scan of them all:
    `feed_batch`); only those that matched are searched again for their group.

    A line the tee cut into several records (longer than MAX_LINE_BYTES) is put together
    again before it is searched, up to MAX_METRIC_LINE_CHARS. Each metric keeps at most
    `log_metric_cap(len(metrics))` points (later ones are dropped, `truncated` says so).
    Not thread-safe: one thread feeds it.
    """

    def __init__(self, definitions: Sequence[tuple[str, str]]) -> None:
        self.refused: dict[str, str] = {}
        self._patterns: list[tuple[str, MetricPattern]] = []
        for name, regex in definitions:
            try:
                self._patterns.append((name, metric_pattern(regex)))
            except ValueError as e:
                self.refused[name] = str(e)
        self.points: dict[str, list[list[float | int | None]]] = {
            name: [] for name, _ in definitions
        }
        self.cap = log_metric_cap(len(self._patterns))
        self.count = 0
        self.truncated = False
        self.skipped_lines = 0
        regexes = [regex for name, regex in definitions if name not in self.refused]
        self._set = _pattern_set(regexes)
        # The same, each regex in multi-line mode, to pass over a batch of lines with one
        # search of them joined: where a regex could match a line alone and not the lines
        # joined (\A, \z, multi-line mode turned off inside it), there is none.
        self._batch_set = (
            None
            if any(_WHOLE_TEXT.search(regex) for regex in regexes)
            else _pattern_set([f"(?m:{regex})" for regex in regexes])
        )
        self._partial: list[str] = []
        self._partial_chars = 0
        self._partial_ts = 0.0
        self._full = False

    def feed(self, ts: float, text: str, *, ends_line: bool = True) -> None:
        """One record of the output, read at `ts`: a whole line, or with `ends_line`
        False a piece the next record continues."""
        if not self._patterns:
            return
        if self._partial or not ends_line:
            if not self._partial:
                self._partial_ts = ts
            room = MAX_METRIC_LINE_CHARS - self._partial_chars
            if room > 0:
                piece = text[:room]
                self._partial.append(piece)
                self._partial_chars += len(piece)
            if not ends_line:
                return
            ts, text = self._partial_ts, "".join(self._partial)
            self._partial, self._partial_chars = [], 0
        self._take(ts, text[:MAX_METRIC_LINE_CHARS])

    def feed_batch(
        self, stamps: Sequence[float], lines: Sequence[str], ends: Sequence[bool]
    ) -> None:
        """`feed` for each record of a batch. A batch in which no metric that can still take
        points matches anywhere costs one RE2 pass over its lines joined, so output that
        holds few metric lines (or only capped ones) costs little more than its reading."""
        if not self._patterns or not lines:
            return
        if self._batch_set is not None and not self._partial and all(ends):
            matched = self._batch_set.Match("\n".join(lines))
            if not matched:
                return
            if all(len(self.points[self._patterns[i][0]]) >= self.cap for i in matched):
                self.truncated = True  # only capped metrics are in these lines
                return
        for ts, line, ends_line in zip(stamps, lines, ends, strict=True):
            self.feed(ts, line, ends_line=ends_line)

    def skip(self, lines: int) -> None:
        """`lines` records of the output were not fed (the extractor fell behind): they are
        counted, and a line under way is dropped rather than joined with a later one."""
        self.skipped_lines += lines
        self._partial, self._partial_chars = [], 0

    def _take(self, ts: float, line: str) -> None:
        if self._full:  # all capped: a match now only says the document was cut
            if not self.truncated and (self._set is None or self._set.Match(line)):
                self.truncated = True
            return
        if self._set is not None:
            matched = self._set.Match(line)
            if not matched:
                return
            candidates = [self._patterns[i] for i in sorted(matched)]
        else:
            candidates = self._patterns
        step: int | None = None
        step_searched = False
        for name, pattern in candidates:
            points = self.points[name]
            if len(points) >= self.cap:  # checked first: a capped metric costs no search
                self.truncated = True
                continue
            match = pattern.search(line)
            if match is None:
                continue
            text = match.group(1) if pattern.groups else match.group(0)
            if text is None:  # the group did not take part
                continue
            try:
                value = float(text)
            except ValueError:
                continue
            if not math.isfinite(value):
                continue
            if not step_searched:
                step, step_searched = _step_of(line), True
            points.append([step, ts, value])
            self.count += 1
            if len(points) >= self.cap:
                self._full = all(len(self.points[n]) >= self.cap for n, _ in self._patterns)

    def document(self, learner_id: int) -> dict[str, object]:
        """What is stored at keys.log_metrics_key."""
        return {
            "format": LOG_METRICS_FORMAT,
            "learner": learner_id,
            "truncated": self.truncated,
            "skipped_lines": self.skipped_lines,
            "metrics": self.points,
        }


def _pattern_set(regexes: list[str]) -> _PatternSet | None:
    """The regexes as one RE2 set (index i: regexes[i]), or None where RE2 cannot build
    one (its memory budget): each regex is then searched on its own."""
    if not regexes:
        return None
    try:
        patterns = re2.Set.SearchSet(_RE2_OPTIONS)
        for regex in regexes:
            patterns.Add(regex)
        patterns.Compile()
    except re2.error:
        return None
    return cast(_PatternSet, patterns)


class _PatternSet(Protocol):
    def Match(self, text: str, /) -> list[int] | None: ...


def _step_of(line: str) -> int | None:
    match = _STEP.search(line)
    digits = match.group(1) if match is not None else None
    if digits is None or len(digits.lstrip("0")) > _MAX_STEP_DIGITS:
        return None
    return int(digits)


def parse_log_metrics_document(data: bytes) -> dict[str, list[LogMetricPoint]]:
    """The metric points of one learner's stored log metrics document, checked field by
    field; raises ValueError saying what is wrong with one that is not as
    LOG_METRICS_FORMAT writes it."""
    metrics = _document_metrics(data, LOG_METRICS_FORMAT)
    result: dict[str, list[LogMetricPoint]] = {}
    for name, points in metrics.items():
        if not isinstance(points, list):
            raise ValueError(f"metric {name!r} is not a list of points")
        parsed = []
        for point in points:
            if (
                not isinstance(point, list)
                or len(point) != 3
                or not (point[0] is None or isinstance(point[0], int))
                or not all(isinstance(x, int | float) for x in point[1:])
                or any(isinstance(x, bool) for x in point)
                or not all(math.isfinite(x) for x in point[1:])
            ):
                raise ValueError(f"metric {name!r} has a point that is not [step, time, value]")
            parsed.append(LogMetricPoint(point[0], float(point[1]), float(point[2])))
        result[name] = parsed
    return result
