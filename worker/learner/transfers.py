"""Transfers: the learner's trusted steps that hold credentials.

*fetch* puts the code (from the platform's store) and the training data (from the
user's bucket) into the learner's directories; *store* puts results and logs back (into
the platform's store and the user's results bucket). The user's command runs between
them and never sees the credentials these use.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from service import storage
from service.storage import keys
from service.storage.archives import UnsafeArchiveError, extract_archive
from service.storage.base import (
    ObjectNotFound,
    ObjectStore,
    StoreUnavailable,
    check_key,
    directory_prefix,
)
from service.storage.config import StoreConfig
from worker.learner.spec import LearnerSpec

if TYPE_CHECKING:
    from service.storage.s3 import S3ObjectStore

_MAX_UPLOAD_ERRORS = 10
_CHUNK = 1024 * 1024
_PROGRESS_SECONDS = 0.5  # how often the data download reports its progress


class PlatformError(Exception):
    """Something outside the user's command went wrong; str(err) says what to do about it."""


def open_store(config: StoreConfig) -> ObjectStore:
    """The object store described by `config`; raises PlatformError if it cannot be built."""
    try:
        return storage.open_store(config)
    except storage.StoreConfigError as e:
        raise PlatformError(str(e)) from e


def open_bucket(config: StoreConfig) -> S3ObjectStore:
    """A user's S3 bucket; PlatformError if the config is unusable."""
    from service.storage.s3 import S3ObjectStore  # a learner with local stores needs no minio

    if config.kind != "s3":
        raise PlatformError("the learner spec names a user's bucket that is not an S3 store")
    store = open_store(config)
    assert isinstance(store, S3ObjectStore)  # open_store opens an s3 config as S3
    return store


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def tree_files(root: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """(key, real path) of every regular file under root, keys = prefix + relative path.

    Symbolic links are followed only to files inside root; directories behind symbolic
    links are not entered. Special files (FIFOs, sockets) are skipped.
    """
    real_root = os.path.realpath(root)
    if not os.path.isdir(real_root):
        return
    for dirpath, dirnames, filenames in os.walk(real_root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            real = os.path.realpath(path)
            if os.path.commonpath([real_root, real]) != real_root:
                continue
            try:
                if not stat.S_ISREG(os.stat(real).st_mode):
                    continue
            except OSError:
                continue  # a dangling link
            yield prefix + Path(path).relative_to(real_root).as_posix(), Path(real)


class Transfers:
    """Fetch and store for one learner."""

    def __init__(self, spec: LearnerSpec, private_dir: Path, log_path: Path) -> None:
        self.spec = spec
        self.private_dir = private_dir
        self.log_path = log_path

    # -- fetch ---------------------------------------------------------------------------

    def fetch_code(self, store: ObjectStore) -> None:
        key = self.spec.model_definition_key
        self.private_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.private_dir, prefix=".model_definition-")
        archive = Path(name)
        try:
            try:
                with os.fdopen(fd, "wb") as out, store.open(key) as src:
                    shutil.copyfileobj(src, out, _CHUNK)
            except ObjectNotFound as e:
                raise PlatformError(f"the code archive {key} is not in the object store") from e
            except Exception as e:
                raise PlatformError(f"the code archive {key} could not be downloaded: {e}") from e
            try:
                extract_archive(archive, Path(self.spec.model_dir))
            except (UnsafeArchiveError, OSError) as e:
                raise PlatformError(f"the code archive could not be unpacked: {e}") from e
        finally:
            archive.unlink(missing_ok=True)

    def check_results_target(self) -> None:
        """Fail now, not after the run, if the user's results bucket cannot be used."""
        target = self.spec.results_target
        if target is None:
            return
        try:
            open_bucket(target.store).check_bucket()
        except StoreUnavailable as e:
            raise PlatformError(f"the training results bucket cannot be used: {e}") from e

    def fetch_data(self, progress: Callable[[str], None]) -> None:
        """Download the training data (every object below the source prefix) into
        data_dir, keeping the paths below the prefix; `progress` hears how far it got."""
        location = self.spec.training_data
        if location is None:
            return
        source = open_bucket(location.store)
        try:
            prefix = directory_prefix(location.prefix)
        except ValueError as e:
            raise PlatformError(f"the training data prefix {location.prefix!r} is invalid") from e
        where = source.description + (f" under {prefix!r}" if prefix else "")
        progress(f"downloading training data from {where}")
        try:
            objects = list(source.list(prefix))
        except StoreUnavailable as e:
            raise PlatformError(f"the training data cannot be read: {e}") from e
        data_dir = Path(self.spec.data_dir)
        total = sum(o.size for o in objects)
        done = 0
        reported = time.monotonic()
        for count, obj in enumerate(objects, 1):
            relative = obj.key[len(prefix) :]
            try:
                check_key(relative)
            except ValueError as e:
                raise PlatformError(
                    f"the training data object {obj.key!r} has a name that cannot be a file"
                ) from e
            target = data_dir / relative
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".download-")
            except OSError as e:
                raise PlatformError(f"the training data cannot be written: {e}") from e
            try:
                with os.fdopen(fd, "wb") as out, source.open(obj.key) as src:
                    shutil.copyfileobj(src, out, _CHUNK)
                os.replace(tmp, target)
            except (ObjectNotFound, StoreUnavailable) as e:
                why = f"{obj.key} disappeared" if isinstance(e, ObjectNotFound) else str(e)
                raise PlatformError(f"the training data could not be downloaded: {why}") from e
            except OSError as e:
                raise PlatformError(f"the training data cannot be written: {e}") from e
            finally:
                Path(tmp).unlink(missing_ok=True)
            done += obj.size
            if time.monotonic() - reported >= _PROGRESS_SECONDS:
                reported = time.monotonic()
                progress(
                    f"downloading training data from {where}: {count} of "
                    f"{len(objects)} files, {_size(done)} of {_size(total)}"
                )
        progress(f"downloaded the training data from {where}: {len(objects)} files, {_size(total)}")

    # -- store ---------------------------------------------------------------------------

    def results_prefix(self) -> str:
        prefix = self.spec.results_prefix
        return prefix if not prefix or prefix.endswith("/") else prefix + "/"

    def log_key(self) -> str:
        return keys.learner_log_key(self.results_prefix(), self.spec.learner_id)

    def log_only(self) -> list[tuple[str, Path]]:
        return [(self.log_key(), self.log_path)]

    def files_to_upload(self) -> Iterator[tuple[str, Path]]:
        spec = self.spec
        if self.log_path.is_file():
            yield self.log_key(), self.log_path
        learner_prefix = keys.learner_logs_prefix(self.results_prefix(), spec.learner_id)
        yield from tree_files(Path(spec.log_dir), learner_prefix)
        if spec.upload_results:
            yield from tree_files(Path(spec.result_dir), self.results_prefix())

    def store(self, store: ObjectStore, files: Sequence[tuple[str, Path]]) -> list[str]:
        """Upload to the platform's store and copy to the user's results bucket; returns
        what failed."""
        return self.upload(store, files) + self.copy_to_target(files)

    @staticmethod
    def upload(
        store: ObjectStore, files: Iterator[tuple[str, Path]] | Sequence[tuple[str, Path]]
    ) -> list[str]:
        """Upload each file; returns what failed, after at most _MAX_UPLOAD_ERRORS failures."""
        errors: list[str] = []
        for key, path in files:
            try:
                store.put_file(key, path)
            except Exception as e:
                errors.append(f"{key}: {e}")
                # The store itself is failing: the other files would fail the same way.
                if isinstance(e, StoreUnavailable) or len(errors) >= _MAX_UPLOAD_ERRORS:
                    break
        return errors

    def copy_to_target(self, files: Sequence[tuple[str, Path]]) -> list[str]:
        """Upload the files also to the user's results bucket, if the manifest names one:
        the same paths below training-<id>/ as below the results prefix."""
        target = self.spec.results_target
        if target is None:
            return []
        try:
            store = open_bucket(target.store)
            prefix = directory_prefix(target.prefix)
        except (PlatformError, ValueError) as e:
            return [f"the training results bucket cannot be used: {e}"]
        ours = self.results_prefix()
        copies = [(prefix + key[len(ours) :], path) for key, path in files if key.startswith(ours)]
        return [f"copying to the results bucket: {e}" for e in self.upload(store, copies)]
