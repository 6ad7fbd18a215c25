"""An object store in a local directory: the embedded default under DLAAS_HOME."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from service.storage.base import ObjectInfo, ObjectNotFound, check_key


class LocalObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _info(self, key: str, path: Path) -> ObjectInfo:
        st = path.stat()
        return ObjectInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Write beside the target and rename: readers never see half an object.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out, path.open("rb") as src:
                shutil.copyfileobj(src, out, 1024 * 1024)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self._info(key, target)

    def open(self, key: str) -> BinaryIO:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError as e:
            raise ObjectNotFound(key) from e

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        return self._info(key, path) if path.is_file() else None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self.root / check_key(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return
        for dirpath, _dirs, files in sorted(os.walk(base)):
            for name in sorted(files):
                if name.startswith(".upload-"):
                    continue
                path = Path(dirpath) / name
                yield self._info(path.relative_to(self.root).as_posix(), path)

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
