"""Transfers: the learner's trusted steps that hold credentials.

*fetch* puts the code (from the platform's store) and the training data (from the
user's bucket) into the learner's directories; *store* puts results and logs back (into
the platform's store and the user's results bucket). The user's command runs between
them and never sees the credentials these use.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from service import storage
from service.logs import open_log_store
from service.logs.base import LogStore
from service.logs.config import LogSinkConfig
from service.storage import keys
from service.storage.archives import UnsafeArchiveError, extract_archive
from service.storage.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    StoreUnavailable,
    check_key,
    directory_prefix,
)
from service.storage.config import StoreConfig
from service.tenantfs import FileRef, FileSignature, RegularFile, TenantDir, tree
from worker.learner.spec import LearnerSpec

if TYPE_CHECKING:
    from service.storage.s3 import S3ObjectStore

_MAX_UPLOAD_ERRORS = 10
_CHUNK = 1024 * 1024
_PROGRESS_SECONDS = 0.5  # how often the data download reports its progress
# Backoff between two attempts to store a file to an unreachable store: 1 s, 2 s, 4 s, ...
_FIRST_WAIT = 1.0
_MAX_WAIT = 10.0


class PlatformError(Exception):
    """Something outside the user's command went wrong; str(err) says what to do about it."""


def open_store(config: StoreConfig) -> ObjectStore:
    """The object store described by `config`; raises PlatformError if it cannot be built."""
    try:
        return storage.open_store(config)
    except storage.StoreConfigError as e:
        raise PlatformError(str(e)) from e


def open_log_sink(sink: LogSinkConfig) -> LogStore:
    """The log store the spec's sink names; PlatformError if it cannot be opened."""
    try:
        return open_log_store(sink.kind, dir=sink.dir, url=sink.url)
    except ValueError as e:
        raise PlatformError(f"the learner spec's log sink is unusable: {e}") from e


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


class Transfers:
    """Fetch and store for one learner."""

    def __init__(self, spec: LearnerSpec, private_dir: Path, log_path: Path) -> None:
        self.spec = spec
        self.private_dir = private_dir
        self.log_path = log_path
        # What is in the platform's store already, by key: the file and its signature when
        # it was uploaded. LOG_DIR's syncs while the command runs fill it, and STORING
        # uploads only what changed since.
        self.synced: dict[str, FileSignature] = {}

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

    def make_directories(self, *extra: str) -> None:
        """The learner's data, result, log and checkpoint directories (and `extra`);
        PlatformError if one cannot be made."""
        spec = self.spec
        try:
            for d in (spec.data_dir, spec.result_dir, spec.log_dir, spec.checkpoint_dir, *extra):
                Path(d).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PlatformError(f"the learner's directories could not be created: {e}") from e

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
        try:
            Path(self.spec.data_dir).mkdir(parents=True, exist_ok=True)
            into = TenantDir.open(self.spec.data_dir)
        except OSError as e:
            raise PlatformError(f"the training data cannot be written: {e}") from e
        with into:
            self._download(source, objects, prefix, into, where, progress)

    def _download(
        self,
        source: ObjectStore,
        objects: list[ObjectInfo],
        prefix: str,
        into: TenantDir,
        where: str,
        progress: Callable[[str], None],
    ) -> None:
        """Each object below `prefix` into DATA_DIR (`into`), through its descriptor."""
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
            try:
                with source.open(obj.key) as src:
                    into.write(relative, src)
            except (ObjectNotFound, StoreUnavailable) as e:
                why = f"{obj.key} disappeared" if isinstance(e, ObjectNotFound) else str(e)
                raise PlatformError(f"the training data could not be downloaded: {why}") from e
            except OSError as e:
                raise PlatformError(f"the training data cannot be written: {e}") from e
            done += obj.size
            if time.monotonic() - reported >= _PROGRESS_SECONDS:
                reported = time.monotonic()
                progress(
                    f"downloading training data from {where}: {count} of "
                    f"{len(objects)} files, {_size(done)} of {_size(total)}"
                )
        progress(f"downloaded the training data from {where}: {len(objects)} files, {_size(total)}")

    def restore_checkpoints(self, store: ObjectStore) -> int:
        """The last attempt's saved CHECKPOINT_DIR (this learner's part of it) into
        checkpoint_dir, before the command runs; the files restored."""
        saved = self.spec.restore_checkpoints
        if saved is None:
            return 0
        try:
            objects = list(store.list(saved))
            part = keys.checkpoints_of_learner(
                saved, [o.key[len(saved) :] for o in objects], self.spec.learner_id
            )
            Path(self.spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            restored = 0
            with TenantDir.open(self.spec.checkpoint_dir) as into:
                for obj in objects:
                    relative = obj.key[len(part) :]
                    if not obj.key.startswith(part) or not relative:
                        continue
                    # Keys the platform wrote from relative paths; checked again all the same.
                    check_key(relative)
                    with store.open(obj.key) as src:
                        into.write(relative, src)
                    restored += 1
        except (ValueError, OSError, ObjectNotFound, StoreUnavailable) as e:
            raise PlatformError(
                f"the checkpoints of the last attempt could not be restored: {e}"
            ) from e
        return restored

    # -- store ---------------------------------------------------------------------------

    def results_prefix(self) -> str:
        prefix = self.spec.results_prefix
        return prefix if not prefix or prefix.endswith("/") else prefix + "/"

    def log_key(self) -> str:
        return keys.learner_log_key(self.results_prefix(), self.spec.learner_id)

    def log_only(self) -> list[tuple[str, FileRef]]:
        return [(self.log_key(), FileRef(self.log_path.parent, self.log_path.name))]

    def files_to_upload(self) -> Iterator[tuple[str, FileRef]]:
        """The learner's log, LOG_DIR's and (if it is uploaded) RESULT_DIR's regular files,
        listed and later read through service.tenantfs (the tenant writes those)."""
        spec = self.spec
        yield from self.log_only()
        learner_prefix = keys.learner_logs_prefix(self.results_prefix(), spec.learner_id)
        yield from tree(spec.log_dir, learner_prefix)
        if spec.upload_results:
            yield from tree(spec.result_dir, self.results_prefix())

    def checkpoint_files(self) -> list[tuple[str, FileRef]]:
        """CHECKPOINT_DIR's regular files and their keys below checkpoints_prefix (none
        where the backend saves CHECKPOINT_DIR itself)."""
        prefix = self.spec.checkpoints_prefix
        if prefix is None:
            return []
        return tree(self.spec.checkpoint_dir, prefix)

    def store(
        self, store: ObjectStore, files: Sequence[tuple[str, FileRef]], *, patient: bool = True
    ) -> list[str]:
        """Upload to the platform's store (what `synced` has unchanged is not uploaded
        again) and copy to the user's results bucket; returns what failed. `patient`: a
        store that is unreachable is retried with backoff (the spec's store_attempts and
        store_retry_seconds); else each file is tried once."""
        return self.upload(store, files, patient=patient, known=self.synced) + (
            self.copy_to_target(files, patient=patient)
        )

    def upload(
        self,
        store: ObjectStore,
        files: Iterator[tuple[str, FileRef]] | Sequence[tuple[str, FileRef]],
        *,
        patient: bool = True,
        known: dict[str, FileSignature] | None = None,
    ) -> list[str]:
        """Upload each file; returns what failed, after at most _MAX_UPLOAD_ERRORS failures.

        A file the store refuses as unreachable (StoreUnavailable: down, restarting, a
        missing bucket) is tried again with exponential backoff, so a store that comes back
        within the retries loses nothing; one that does not fails the upload with the
        store's own message (it names the endpoint and the bucket). With `known` (what
        the store has, by key), a file whose signature is the one recorded there is not
        uploaded again, and each upload records the signature the file had before it."""
        errors: list[str] = []
        for key, ref in files:
            # Opened beneath its directory, never by name: not a regular file of its own
            # (a link, a FIFO, a hard link, gone) is skipped. The signature is the
            # descriptor's, so it is that of the bytes uploaded.
            opened = ref.open()
            if opened is None:
                continue
            with opened:
                if known is not None and known.get(key) == opened.signature:
                    continue
                try:
                    self._put(store, key, opened, patient)
                    if known is not None:
                        known[key] = opened.signature
                except Exception as e:
                    errors.append(f"{key}: {e}")
                    # The store itself is failing: the other files would fail the same way.
                    if isinstance(e, StoreUnavailable) or len(errors) >= _MAX_UPLOAD_ERRORS:
                        break
        return errors

    def _put(self, store: ObjectStore, key: str, opened: RegularFile, patient: bool) -> None:
        attempts = self.spec.store_attempts if patient else 1
        started = time.monotonic()
        retrying = Retrying(
            retry=retry_if_exception_type(StoreUnavailable),
            stop=stop_after_attempt(attempts) | stop_after_delay(self.spec.store_retry_seconds),
            wait=wait_exponential(multiplier=_FIRST_WAIT, max=_MAX_WAIT),
            before_sleep=_say_retrying(key),
            reraise=True,
        )
        try:
            # A new reader each attempt: each reads the size fstat gave, from the start.
            retrying(lambda: store.put_stream(key, opened.reader(), opened.size))
        except StoreUnavailable as e:
            tried = retrying.statistics.get("attempt_number", 1)
            if tried > 1:
                elapsed = time.monotonic() - started
                raise StoreUnavailable(
                    f"{e} (gave up after {tried} attempts in {elapsed:.0f} s)"
                ) from e
            raise

    def copy_to_target(
        self, files: Sequence[tuple[str, FileRef]], *, patient: bool = True
    ) -> list[str]:
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
        copies = [(prefix + key[len(ours) :], ref) for key, ref in files if key.startswith(ours)]
        errors = self.upload(store, copies, patient=patient)
        return [f"copying to the results bucket: {e}" for e in errors]


def _say_retrying(key: str) -> Callable[[RetryCallState], None]:
    """Tells the learner's stderr (the wrapper's log) about each retry."""

    def say(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        print(
            f"learner wrapper: storing {key} failed (attempt {state.attempt_number}), "
            f"retrying in {wait:.1f} s: {error}",
            file=sys.stderr,
            flush=True,
        )

    return say
