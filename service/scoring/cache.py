"""The models a scoring process serves: fetched from the object store into a local cache
directory, run each in a sandboxed process of its own (service.scoring.process), and
called through a batcher."""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.domain.signature import SignatureInfo
from service.scoring.batching import (
    Arrivals,
    DirectRunner,
    DynamicBatcher,
    LoopBatcher,
    ModelUnloaded,
    Runner,
    Tensors,
)
from service.scoring.process import ModelProblem, ProcessConfig
from service.scoring.supervised import Report, SupervisedModel
from service.storage.base import ObjectStore
from service.ttlcache import TtlCache

log = logging.getLogger("dlaas.scoring")

# Written last when a model is copied, so its presence means the copy is whole.
_MARKER = "saved_model.pb"


@dataclass(frozen=True)
class BatchingConfig:
    enabled: bool
    max_batch_size: int
    max_wait: float  # seconds
    threads: int


def fetch_tree(store: ObjectStore, prefix: str, dest: Path) -> int:
    """Download every object under `prefix` into `dest` (created whole or not at all, by
    renaming a finished temporary directory); returns how many files there were."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        count = 0
        for info in store.list(prefix):
            target = tmp / info.key[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            with store.open(info.key) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
            count += 1
        if count:
            tmp.rename(dest)
        return count
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def upload_tree(store: ObjectStore, source: Path, prefix: str) -> None:
    """Upload `source` under `prefix`, the SavedModel's graph last (see _MARKER)."""
    files = sorted(p for p in source.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.relative_to(source).as_posix() == _MARKER)
    for path in files:
        store.put_file(prefix + path.relative_to(source).as_posix(), path)


class ServedModel:
    """One deployment's model process and the runners its signatures are called through."""

    def __init__(self, model: SupervisedModel, batching: BatchingConfig, name: str) -> None:
        self.model = model
        self.signatures: dict[str, SignatureInfo] = model.signatures
        self._batching = batching
        self._name = name
        self._runners: dict[str, Runner] = {}
        self._lock = threading.Lock()
        # Requests on their way to this model, so that batches wait only for them.
        self.arrivals = Arrivals()
        self._closed = False

    def submit(self, signature: str, tensors: Tensors, rows: int) -> Future[dict[str, np.ndarray]]:
        runner = self._runners.get(signature) or self._runner(signature)
        return runner.submit(tensors, rows)

    def _runner(self, signature: str) -> Runner:
        with self._lock:
            if self._closed:
                raise ModelUnloaded("the model was unloaded")
            if signature in self._runners:
                return self._runners[signature]
            b = self._batching
            info = self.signatures[signature]

            def call(tensors: Tensors) -> dict[str, np.ndarray]:
                return self.model.call(info, tensors)

            runner: Runner
            if b.enabled and self.signatures[signature].batchable:
                threads = DynamicBatcher(
                    call,
                    max_batch_size=b.max_batch_size,
                    max_wait=b.max_wait,
                    threads=b.threads,
                    name=self._name,
                    arrivals=self.arrivals,
                )
                runner = LoopBatcher(
                    functools.partial(self.model.start_call, info),
                    threads,
                    max_batch_size=b.max_batch_size,
                    max_wait=b.max_wait,
                    arrivals=self.arrivals,
                )
            else:
                runner = DirectRunner(call, threads=b.threads, name=self._name)
            self._runners[signature] = runner
            return runner

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for runner in self._runners.values():
                runner.close()
            self._runners.clear()
        self.model.close()


# A model that failed to start is not started again for this long on the request path.
_FAILURE_TTL = 30.0


class ModelCache:
    """Deployment id -> ServedModel, each started at most once at a time."""

    def __init__(
        self,
        store: ObjectStore,
        root: Path,
        batching: BatchingConfig,
        process: ProcessConfig,
        report: Report,
    ) -> None:
        self.store = store
        self.root = root
        self.batching = batching
        self.process = process
        self.report = report
        self._models: dict[str, ServedModel] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._failed: TtlCache[str, ModelProblem] = TtlCache(_FAILURE_TTL)
        self._lock = threading.Lock()
        self._closed = False

    def local_dir(self, deployment_id: str) -> Path:
        return self.root / "models" / deployment_id

    def cached(self, deployment_id: str) -> ServedModel | None:
        return self._models.get(deployment_id)

    def cached_ids(self) -> list[str]:
        with self._lock:
            return list(self._models)

    def load(self, deployment_id: str, model_key: str, *, retry: bool = False) -> ServedModel:
        """The deployment's model: cached, or fetched (if not on disk yet) and started in
        its process, which checks it, loads it and warms it up with one call of its
        serving signature. ModelProblem says why it cannot be; one that failed is not tried
        again for a while unless `retry`."""
        served = self._models.get(deployment_id)
        if served is not None:
            return served
        failed = None if retry else self._failed.get(deployment_id)
        if failed is not None:
            raise failed
        with self._lock:
            gate = self._loading.setdefault(deployment_id, threading.Lock())
        with gate:
            served = self._models.get(deployment_id)
            if served is not None:
                return served
            local = self.local_dir(deployment_id)
            if not (local / _MARKER).is_file():
                shutil.rmtree(local, ignore_errors=True)
                if not fetch_tree(self.store, model_key, local):
                    raise FileNotFoundError(f"no model is stored under {model_key}")
            model = SupervisedModel(deployment_id, local, self.process, self.report)
            try:
                model.start()
            except ModelProblem as e:
                self._failed.put(deployment_id, e)
                raise
            served = ServedModel(model, self.batching, deployment_id)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._models[deployment_id] = served
            if closed:  # the service stopped meanwhile: leave no process behind
                served.close()
                raise ModelUnloaded("the scoring service stopped")
            log.info("started the model process of deployment %s (%s)", deployment_id, model_key)
            return served

    def forget(self, deployment_id: str) -> None:
        """Stop the model's process and remove its local copy."""
        with self._lock:
            served = self._models.pop(deployment_id, None)
            self._loading.pop(deployment_id, None)
        self._failed.forget(lambda key: key == deployment_id)
        if served is not None:
            served.close()
        shutil.rmtree(self.local_dir(deployment_id), ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for deployment_id in self.cached_ids():
            with self._lock:
                served = self._models.pop(deployment_id, None)
            if served is not None:
                served.close()
