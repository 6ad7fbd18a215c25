"""The scalars of a learner's TensorBoard event files, read with TensorBoard's own reader
(`EventFileLoader`) into metric points (what `worker.learner.logdir` stores for a training
whose metrics come from TensorBoard).

The event files are the tenant's output, so untrusted: they are read in the trusted
wrapper, one learner's files in one learner's wrapper, incrementally (each loader keeps its
place in its file). A file the command is still writing ends in a partial record: the
reader stops there and goes on from it at the next pass. A corrupt record (a bad checksum)
stops the reading of that file alone; a file bigger than MAX_EVENT_FILE_BYTES is not read.

Imported only by the wrappers of such trainings: TensorBoard's reader takes a third of a
second to import (boto3 comes with its file layer), which every learner would otherwise
spend before its command starts.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.domain.metrics import (
    MAX_TENSORBOARD_NAME_CHARS,
    MAX_TENSORBOARD_POINTS,
    TENSORBOARD_FORMAT,
    tensorboard_metric_name,
)
from service.tenantfs import RegularFile, TenantDir

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
# Each event file read keeps its descriptor open (see ScalarReader.read): at most this many.
MAX_EVENT_FILES = 1000


@dataclass
class _EventFile:
    loader: EventFileLoader
    run: str
    file: RegularFile  # the descriptor the loader reads through
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
        directory = TenantDir.open_if_dir(self.root)
        if directory is None:
            return 0
        with directory:
            for relative in directory.files():
                if IsTensorFlowEventsFile(relative):
                    self._read_file(directory, relative)
        return self.count - before

    def _read_file(self, directory: TenantDir, relative: str) -> None:
        state = self._files.get(relative)
        if state is None:
            if len(self._files) >= MAX_EVENT_FILES:
                self._warn(
                    "files", f"more than {MAX_EVENT_FILES} event files: the rest are not read"
                )
                return
            opened = directory.open_file(relative)
            if opened is None:  # gone since it was listed, or not a regular file of its own
                return
            # TensorBoard's loader takes a path, never a file object, and its local file
            # system opens that path again at every read. So it is given the descriptor
            # opened here (beneath LOG_DIR, no link followed, a regular file with one link)
            # as /proc/self/fd/N: every reopening names that descriptor's file, whatever
            # the tenant does to the name in LOG_DIR meanwhile. The descriptor stays open
            # as long as the loader lives (MAX_EVENT_FILES of them at most).
            try:
                loader = EventFileLoader(f"/proc/self/fd/{opened.fd}")
            except Exception as e:
                opened.close()
                self._warn(relative, f"cannot open the event file {relative}: {e}")
                return
            parent = Path(relative).parent.as_posix()
            state = self._files[relative] = _EventFile(
                loader, "" if parent == "." else parent, opened
            )
        if state.broken:
            return
        try:
            if state.file.current_size() > MAX_EVENT_FILE_BYTES:
                state.broken = True
                self._warn(
                    relative,
                    f"the event file {relative} is larger than {MAX_EVENT_FILE_BYTES} "
                    "bytes: its scalars are not read",
                )
                return
            for event in state.loader.Load():
                self._take(state, event)
        except Exception as e:  # a record that is not an event: this file is done
            state.broken = True
            self._warn(relative, f"the event file {relative} cannot be read further: {e}")

    def document(self, learner_id: int) -> dict[str, Any]:
        """What is stored at keys.tensorboard_metrics_key."""
        return {
            "format": TENSORBOARD_FORMAT,
            "learner": learner_id,
            "truncated": self.truncated,
            "metrics": self.points,
        }

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
