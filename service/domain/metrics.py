"""Users' metric regexes, compiled with RE2: the one rule for what a metric pattern is.

Kept apart from the manifest so the learner and the log readers use it without importing
the manifest's schema (pydantic).
"""

from __future__ import annotations

from typing import Protocol, cast

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
