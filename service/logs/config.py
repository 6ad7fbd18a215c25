"""Where a learner's log lines go live, as plain data a learner's spec carries (see
service.domain.records and service.logs.open_log_store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from service.domain.records import OPT_STR, STR, OfKind, checked_fields


@dataclass(frozen=True)
class LogSinkConfig(OfKind):
    """Where the learner's log lines go live (see service.logs)."""

    kind: str  # "file" or "redis"
    dir: str | None = None  # file
    url: str | None = None  # redis

    NAME: ClassVar[str] = "log_sink"
    KINDS: ClassVar[tuple[str, ...]] = ("file", "redis")
    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        "kind": STR,
        "dir": OPT_STR,
        "url": OPT_STR,
    }

    @classmethod
    def from_dict(cls, data: Any, where: str = "log_sink") -> LogSinkConfig:
        return cls(**checked_fields(cls, data, where))
