"""The one interface for everything a training reads or writes outside the database.

Two implementations: `service.storage.local.LocalObjectStore` (a directory under
DLAAS_HOME, the embedded default) and `service.storage.s3.S3ObjectStore` (MinIO, AWS S3 or
any S3-compatible endpoint, through the `minio` client). `service.storage.open_object_store`
picks one from the settings.

Keys are `/`-separated relative paths (`trainings/<id>/results/model/saved_model.pb`).
Prefixes name "directories": `list("trainings/x/results")` and `list("trainings/x/results/")`
both mean everything below `trainings/x/results/`, never `trainings/x/results2/...`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Protocol

# Objects larger than this are uploaded in parts of this size (S3); no implementation holds
# more than a few parts of an object in memory.
DEFAULT_PART_SIZE = 16 * 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime


class ObjectNotFound(KeyError):
    pass


class StoreUnavailable(Exception):
    """The store cannot be used (unreachable, missing bucket, refused credentials).

    str(err) names the store and the bucket, e.g. "the S3 store at http://10.0.0.5:9000 has
    no bucket 'results'"; it never contains credentials.
    """


class ObjectStore(Protocol):
    """Keys are `/`-separated relative paths, e.g. `trainings/<id>/model_definition.zip`."""

    @property
    def description(self) -> str:
        """Where the objects are, for messages: "the S3 store at <endpoint> (bucket 'b')"."""
        ...

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        """Upload a local file (streamed; in parts above the part size)."""
        ...

    def put_stream(self, key: str, stream: BinaryIO, length: int | None = None) -> ObjectInfo:
        """Upload everything `stream` yields (exactly `length` bytes if given; else until
        its end), streamed. Readers never see a partly written object."""
        ...

    def open(self, key: str) -> BinaryIO:
        """A reader for the object; raises ObjectNotFound."""
        ...

    def open_range(self, key: str, start: int, end: int | None = None) -> BinaryIO:
        """A reader for bytes [start, end) of the object (to its end if end is None);
        raises ObjectNotFound. The caller checks the range against stat()."""
        ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        """Every object below the `prefix` directory ("" = all), in key order; with
        `start_after`, only those whose keys sort after it. Lazy: what is not taken of the
        listing is not read (a page of it costs a page, on S3 and locally alike)."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; returns how many were deleted."""
        ...

    def presigned_url(self, key: str, expires_seconds: int = 3600) -> str | None:
        """A URL that reads the object without credentials, or None where the store has
        no such thing (the local directory)."""
        ...


def check_key(key: str) -> str:
    """Refuse keys that are absolute or climb out of the store."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in key:
        raise ValueError(f"invalid object key: {key!r}")
    return key


def directory_prefix(prefix: str) -> str:
    """`a/b`, `a/b/` -> `a/b/`; `` or `/` -> `` (everything). Checked like a key."""
    stripped = prefix.strip("/")
    return check_key(stripped) + "/" if stripped else ""
