"""An object store in a local directory: the embedded default under DLAAS_HOME."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from service.private import private_dir
from service.storage.base import ObjectInfo, ObjectNotFound, check_key, directory_prefix

_CHUNK = 1024 * 1024
_TEMP_PREFIX = ".upload-"


class _Window(io.RawIOBase):
    """Reads at most `remaining` bytes of an open file from its current position."""

    def __init__(self, f: BinaryIO, remaining: int | None) -> None:
        self._f = f
        self._remaining = remaining

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = len(buffer)
        if self._remaining is not None:
            want = min(want, self._remaining)
        if want <= 0:
            return 0
        data = self._f.read(want)
        buffer[: len(data)] = data
        if self._remaining is not None:
            self._remaining -= len(data)
        return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


class LocalObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        private_dir(self.root)
        self.description = f"the local object store {root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _info(self, key: str, path: Path) -> ObjectInfo:
        st = path.stat()
        return ObjectInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        with path.open("rb") as src:
            return self.put_stream(key, src)

    def put_stream(self, key: str, stream: BinaryIO, length: int | None = None) -> ObjectInfo:
        target = self._path(key)
        private_dir(target.parent)
        # Write beside the target and rename: readers never see half an object.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TEMP_PREFIX)
        try:
            written = 0
            with os.fdopen(fd, "wb") as out:
                while length is None or written < length:
                    want = _CHUNK if length is None else min(_CHUNK, length - written)
                    chunk = stream.read(want)
                    if not chunk:
                        break
                    out.write(chunk)
                    written += len(chunk)
            if length is not None and written != length:
                raise ValueError(f"{key}: the stream ended after {written} of {length} bytes")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self._info(key, target)

    def open(self, key: str) -> BinaryIO:
        try:
            return self._path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFound(key) from e

    def open_range(self, key: str, start: int, end: int | None = None) -> BinaryIO:
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"invalid byte range [{start}, {end})")
        f = self.open(key)
        f.seek(start)
        return io.BufferedReader(_Window(f, None if end is None else end - start))

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        return self._info(key, path) if path.is_file() else None

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        directory = directory_prefix(prefix)
        base = self.root / directory if directory else self.root
        if not base.is_dir():
            return
        yield from self._walk(base, directory, start_after)

    def _walk(self, path: Path, key_prefix: str, start_after: str) -> Iterator[ObjectInfo]:
        """The objects below directory `path` (whose keys start with `key_prefix`) after
        `start_after`, in key order, one directory read at a time: its entries sorted by
        name, a subdirectory's as `name/` (so its keys come where S3 lists them), and a
        subdirectory whose keys all sort before `start_after` not read at all. Symbolic
        links to directories are not followed, as os.walk does not."""
        try:
            with os.scandir(path) as scan:
                entries = sorted(
                    ((e.name + "/" if e.is_dir() else e.name), e)
                    for e in scan
                    if not e.name.startswith(_TEMP_PREFIX)
                )
        except (FileNotFoundError, NotADirectoryError):  # deleted since it was listed
            return
        for name, entry in entries:
            key = key_prefix + name
            if name.endswith("/"):
                if entry.is_symlink() or (key < start_after and not start_after.startswith(key)):
                    continue
                yield from self._walk(Path(entry.path), key, start_after)
            elif key > start_after:
                try:
                    yield self._info(key, Path(entry.path))
                except FileNotFoundError:  # deleted since the listing
                    continue

    def delete_prefix(self, prefix: str) -> int:
        base = self.root / check_key(prefix.rstrip("/"))
        if base.is_file():
            base.unlink()
            return 1
        if not base.is_dir():
            return 0
        count = sum(len(files) for _d, _s, files in os.walk(base))
        shutil.rmtree(base)
        return count

    def presigned_url(self, key: str, expires_seconds: int = 3600) -> str | None:
        check_key(key)
        return None
