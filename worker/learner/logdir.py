"""LOG_DIR while the user's command runs: synced to the object store every
`log_dir_sync_seconds` (new and changed files only), and, for a training whose metrics come
from TensorBoard (`evaluation_metrics: {type: tensorboard}`), its event files' scalars read
into metric points stored at `keys.tensorboard_metrics_key`.

The event files are the tenant's output, so untrusted: they are read here, in the trusted
wrapper, with TensorBoard's own reader (`EventFileLoader`), one learner's files in one
learner's wrapper, incrementally (each loader keeps its place in its file), and what the
API later reads is the bounded JSON this module writes, never the files themselves. A file
the command is still writing ends in a partial record: the reader stops there and goes on
from it at the next pass. A corrupt record (a bad checksum) stops the reading of that file
alone; a file bigger than MAX_EVENT_FILE_BYTES is not read (it is still synced).
"""

from __future__ import annotations

import io
import json
import math
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.domain.metrics import (
    MAX_TENSORBOARD_NAME_CHARS,
    MAX_TENSORBOARD_POINTS,
    TENSORBOARD_FORMAT,
    tensorboard_metric_name,
)
from service.storage import keys
from service.storage.base import ObjectStore
from worker.learner.spec import LearnerSpec
from worker.learner.transfers import Transfers, tree_files

# TensorBoard reads records with TensorFlow's reader when TensorFlow can be imported, and
# with its own pure-Python one otherwise. The wrapper must not load TensorFlow (seconds
# and hundreds of MiB per learner, for a record reader), so it asks for the pure-Python one
# as TensorBoard's own build without TensorFlow does: by the module `tensorboard.compat.notf`
# being importable (see tensorboard.compat.tf).
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

from tensorboard.backend.event_processing.event_file_loader import (  # noqa: E402
    EventFileLoader,
)
from tensorboard.backend.event_processing.io_wrapper import (  # noqa: E402
    IsTensorFlowEventsFile,
)
from tensorboard.plugins.scalar.metadata import PLUGIN_NAME as SCALARS  # noqa: E402
from tensorboard.util.tensor_util import make_ndarray  # noqa: E402

# Event files bigger than this are not read: the reader holds up to one record in memory
# (twice, as it buffers), which a crafted file can make as big as the file, and the pod's
# agent that reads them on Kubernetes is limited to 512 MiB.
MAX_EVENT_FILE_BYTES = 64 * 1024 * 1024


@dataclass
class _EventFile:
    loader: EventFileLoader
    run: str
    # A tag's plugin, from the first value that carried its metadata (TensorFlow 2
    # writes a tag's metadata once per file, with its first value).
    plugins: dict[str, str] = field(default_factory=dict)
    broken: bool = False


class ScalarReader:
    """Every scalar written to the event files under `root`, read a pass at a time.

    `points` maps a metric name (service.domain.metrics.tensorboard_metric_name) to
    `[step, wall_time, value]` triples in the order they
    were read (per file, the order they were written); at most MAX_TENSORBOARD_POINTS in all.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.points: dict[str, list[list[float]]] = {}
        self.count = 0
        self.truncated = False
        self._files: dict[str, _EventFile] = {}
        self._warned: set[str] = set()

    def read(self) -> int:
        """Read what was added to the event files since the last pass; the new points."""
        before = self.count
        for relative, path in self._event_files():
            state = self._files.get(relative)
            if state is None:
                try:
                    loader = EventFileLoader(str(path))
                except Exception as e:  # gone since it was listed, or unreadable
                    self._warn(relative, f"cannot open the event file {relative}: {e}")
                    continue
                parent = Path(relative).parent.as_posix()
                state = self._files[relative] = _EventFile(loader, "" if parent == "." else parent)
            if state.broken:
                continue
            try:
                if path.stat().st_size > MAX_EVENT_FILE_BYTES:
                    state.broken = True
                    self._warn(
                        relative,
                        f"the event file {relative} is larger than {MAX_EVENT_FILE_BYTES} "
                        "bytes: its scalars are not read",
                    )
                    continue
                for event in state.loader.Load():
                    self._take(state, event)
            except Exception as e:  # a record that is not an event: this file is done
                state.broken = True
                self._warn(relative, f"the event file {relative} cannot be read further: {e}")
        return self.count - before

    def document(self, learner_id: int) -> dict[str, Any]:
        """What is stored at keys.tensorboard_metrics_key."""
        return {
            "format": TENSORBOARD_FORMAT,
            "learner": learner_id,
            "truncated": self.truncated,
            "metrics": self.points,
        }

    def _event_files(self) -> Iterator[tuple[str, Path]]:
        for relative, path in tree_files(self.root, ""):
            if IsTensorFlowEventsFile(relative):
                yield relative, path

    def _take(self, state: _EventFile, event: Any) -> None:
        if not event.HasField("summary"):
            return
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            if plugin:
                state.plugins.setdefault(value.tag, plugin)
            if state.plugins.get(value.tag) != SCALARS or not value.HasField("tensor"):
                continue
            array = make_ndarray(value.tensor)
            if array.size != 1:
                continue
            try:
                number = float(array.reshape(()).item())
            except (TypeError, ValueError):
                continue
            name = tensorboard_metric_name(state.run, value.tag)
            if not math.isfinite(number) or len(name) > MAX_TENSORBOARD_NAME_CHARS:
                continue
            if self.count >= MAX_TENSORBOARD_POINTS:
                self.truncated = True
                return
            self.points.setdefault(name, []).append([int(event.step), event.wall_time, number])
            self.count += 1

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            print(f"learner wrapper: {message}", file=sys.stderr, flush=True)


class LogDirSync:
    """Syncs LOG_DIR (and the TensorBoard metrics read from it) every
    `spec.log_dir_sync_seconds` in a thread of its own, from `start` until `stop`, which
    makes one last pass. Every pass uploads only the files that are new or changed since
    they were last uploaded (`Transfers.synced`, which STORING uses too), each tried once:
    a store that is down now is tried again at the next pass."""

    def __init__(self, spec: LearnerSpec, transfers: Transfers, store: ObjectStore) -> None:
        self.spec = spec
        self.transfers = transfers
        self.store = store
        self.reader = ScalarReader(Path(spec.log_dir)) if spec.tensorboard_metrics else None
        self._stored_points = 0  # the points in the stored document (none stored: 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-dir-sync", daemon=True)
        self._warned: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, last_pass: bool = True) -> None:
        """End the periodic passes and, with `last_pass`, make one more: what the command
        wrote last (a stopped learner has only its stop grace and skips it)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        if last_pass:
            self.sync()

    def _run(self) -> None:
        while not self._stop.wait(self.spec.log_dir_sync_seconds):
            self.sync()

    def sync(self) -> None:
        """One pass: the changed files of LOG_DIR, then the metric points if there are new
        ones. Never raises: the training goes on whatever the store does meanwhile."""
        try:
            files = list(
                tree_files(
                    Path(self.spec.log_dir),
                    keys.learner_logs_prefix(self.transfers.results_prefix(), self.spec.learner_id),
                )
            )
            errors = self.transfers.upload(
                self.store, files, patient=False, known=self.transfers.synced
            )
            if errors:
                self._warn("upload", f"syncing LOG_DIR failed, it is tried again: {errors[0]}")
            if self.reader is not None:
                self.reader.read()
                self._store_metrics()
        except Exception as e:
            self._warn("sync", f"syncing LOG_DIR failed: {type(e).__name__}: {e}")

    def _store_metrics(self) -> None:
        assert self.reader is not None
        count = self.reader.count + (1 if self.reader.truncated else 0)
        if count == self._stored_points:
            return
        document = json.dumps(self.reader.document(self.spec.learner_id), separators=(",", ":"))
        data = document.encode("utf-8")
        key = keys.tensorboard_metrics_key(self.spec.training_id, self.spec.learner_id)
        try:
            self.store.put_stream(key, io.BytesIO(data), len(data))
        except Exception as e:
            self._warn("metrics", f"storing the TensorBoard metrics failed: {e}")
            return
        self._stored_points = count

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            print(f"learner wrapper: {message}", file=sys.stderr, flush=True)
