"""LOG_DIR while the user's command runs: synced to the object store every
`log_dir_sync_seconds` (new and changed files only), and, for a training whose metrics come
from TensorBoard (`evaluation_metrics: {type: tensorboard}`), its event files' scalars read
into metric points stored at `keys.tensorboard_metrics_key`; and, for a training with metric
regexes, the points they found in the command's output so far (`worker.learner.logmetrics`,
fed by the log tee) stored at `keys.log_metrics_key`.

The event files are the tenant's output, so untrusted: they are read in the trusted
wrapper (`worker.learner.scalars`, imported only for such a training), and what the API
later reads is the bounded JSON this module writes, never the files themselves. An event
file too big to read is still synced.
"""

from __future__ import annotations

import io
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from service.storage import keys
from service.storage.base import ObjectStore
from service.tenantfs import tree
from worker.learner.logmetrics import LogMetrics
from worker.learner.spec import LearnerSpec
from worker.learner.transfers import Transfers

if TYPE_CHECKING:
    from worker.learner.scalars import ScalarReader


class LogDirSync:
    """Syncs LOG_DIR (and the TensorBoard metrics read from it) every
    `spec.log_dir_sync_seconds` in a thread of its own, from `start` until `stop`, which
    makes one last pass. Every pass uploads only the files that are new or changed since
    they were last uploaded (`Transfers.synced`, which STORING uses too), each tried once:
    a store that is down now is tried again at the next pass."""

    def __init__(
        self,
        spec: LearnerSpec,
        transfers: Transfers,
        store: ObjectStore,
        log_metrics: LogMetrics | None = None,
    ) -> None:
        self.spec = spec
        self.log_metrics = log_metrics
        self._stored_log_version: tuple[int, int, bool] = (0, 0, False)
        self.transfers = transfers
        self.store = store
        self.reader: ScalarReader | None = None
        if spec.tensorboard_metrics:
            from worker.learner.scalars import ScalarReader  # TensorBoard: only when used

            self.reader = ScalarReader(Path(spec.log_dir))
        self._stored_points = 0  # the points in the stored document (none stored: 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-dir-sync", daemon=True)
        self._warned: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, last_pass: bool = True) -> None:
        """End the periodic passes and, with `last_pass`, make one more: what the command
        wrote last (a stopped learner has only its stop grace and skips it, but for the
        log's metric points: one small object)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        if last_pass:
            self.sync()
        else:
            self._store_log_metrics()

    def _run(self) -> None:
        while not self._stop.wait(self.spec.log_dir_sync_seconds):
            self.sync()

    def sync(self) -> None:
        """One pass: the changed files of LOG_DIR, then the metric points if there are new
        ones. Never raises: the training goes on whatever the store does meanwhile."""
        try:
            # Listed from LOG_DIR's descriptor; each file is opened beneath it when it is
            # uploaded, and its signature is the descriptor's fstat (service.tenantfs).
            files = tree(
                self.spec.log_dir,
                keys.learner_logs_prefix(self.transfers.results_prefix(), self.spec.learner_id),
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
        self._store_log_metrics()

    def _store_log_metrics(self) -> None:
        """The log's metric points, if there are new ones since they were last stored."""
        if self.log_metrics is None:
            return
        try:
            version = self.log_metrics.version()
            if version == self._stored_log_version:
                return
            data = self.log_metrics.document()
            key = keys.log_metrics_key(self.spec.training_id, self.spec.learner_id)
            self.store.put_stream(key, io.BytesIO(data), len(data))
        except Exception as e:
            self._warn("log-metrics", f"storing the log's metrics failed: {e}")
            return
        self._stored_log_version = version

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
