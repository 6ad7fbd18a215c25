"""The one interface for everything a training reads or writes outside the database."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Protocol


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime


class ObjectNotFound(KeyError):
    pass


class ObjectStore(Protocol):
    """Keys are `/`-separated relative paths, e.g. `trainings/<id>/model_definition.zip`."""

    def put_file(self, key: str, path: Path) -> ObjectInfo: ...

    def open(self, key: str) -> BinaryIO:
        """A reader for the object; raises ObjectNotFound."""
        ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]: ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; returns how many were deleted."""
        ...


def check_key(key: str) -> str:
    """Refuse keys that are absolute or climb out of the store."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in key:
        raise ValueError(f"invalid object key: {key!r}")
    return key
