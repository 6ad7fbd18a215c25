"""The models a scoring process serves, one per version of a deployment (`ModelKey`):
fetched from the object store into a local cache directory, run each in a sandboxed
process of its own (service.scoring.process), and called through a batcher."""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.domain.deployments import MODEL_MARKERS
from service.domain.signature import SignatureInfo
from service.scoring.batching import (
    Arrivals,
    DirectRunner,
    DynamicBatcher,
    ModelUnloaded,
    Runner,
    Tensors,
)
from service.scoring.loop_batching import LoopBatcher
from service.scoring.process import ModelProblem, ProcessConfig
from service.scoring.supervised import SupervisedModel
from service.storage.base import ObjectStore
from service.ttlcache import TtlCache

log = logging.getLogger("dlaas.scoring")

# Written last when a model is copied, so its presence means the copy is whole: a
# SavedModel's graph, or an ONNX model's file.
_MARKERS = MODEL_MARKERS


def has_model(local: Path) -> bool:
    """Whether `local` holds a whole copy of a model."""
    return any((local / marker).is_file() for marker in _MARKERS)


# (deployment id, version): what a model process serves.
ModelKey = tuple[str, int]
# What happened to a served model's process, for its deployment's version.
VersionReport = Callable[[ModelKey, str], None]


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
    """Upload `source` under `prefix`, the model's own file last (see _MARKERS)."""
    files = sorted(p for p in source.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.relative_to(source).as_posix() in _MARKERS)
    for path in files:
        store.put_file(prefix + path.relative_to(source).as_posix(), path)


class ServedModel:
    """One deployment's model process and the runners its signatures are called through."""

    def __init__(
        self, model: SupervisedModel, batching: BatchingConfig, name: str, arrivals: Arrivals
    ) -> None:
        self.model = model
        self.signatures: dict[str, SignatureInfo] = model.signatures
        self._batching = batching
        self._name = name
        self._runners: dict[str, Runner] = {}
        self._lock = threading.Lock()
        # Requests on their way to this deployment (whichever version they resolve to:
        # they are announced before it is known), so that batches wait only for them.
        self.arrivals = arrivals
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
    """(deployment id, version) -> ServedModel, each started at most once at a time."""

    def __init__(
        self,
        store: ObjectStore,
        root: Path,
        batching: BatchingConfig,
        process: ProcessConfig,
        report: VersionReport,
    ) -> None:
        self.store = store
        self.root = root
        self.batching = batching
        self.process = process
        self.report = report
        self._models: dict[ModelKey, ServedModel] = {}
        self._loading: dict[ModelKey, threading.Lock] = {}
        self._arrivals: dict[str, Arrivals] = {}
        self._failed: TtlCache[ModelKey, ModelProblem] = TtlCache(_FAILURE_TTL)
        self._lock = threading.Lock()
        self._closed = False

    def local_dir(self, key: ModelKey) -> Path:
        deployment_id, version = key
        return self.root / "models" / deployment_id / str(version)

    def cached(self, deployment_id: str, version: int | None = None) -> ServedModel | None:
        """The served model of that version of the deployment; with no version, of its
        highest version loaded here."""
        if version is not None:
            return self._models.get((deployment_id, version))
        with self._lock:
            mine = [key for key in self._models if key[0] == deployment_id]
        return self._models.get(max(mine)) if mine else None

    def arrivals(self, deployment_id: str) -> Arrivals | None:
        """The deployment's arrivals, where any of its versions is loaded here."""
        return self._arrivals.get(deployment_id)

    def cached_ids(self) -> list[ModelKey]:
        with self._lock:
            return list(self._models)

    def load(self, key: ModelKey, model_key: str, *, retry: bool = False) -> ServedModel:
        """The model of a deployment's version: cached, or fetched (if not on disk yet) and
        started in its process, which checks it, loads it and warms it up with one call of
        its serving signature. ModelProblem says why it cannot be; one that failed is not
        tried again for a while unless `retry`."""
        served = self._models.get(key)
        if served is not None:
            return served
        failed = None if retry else self._failed.get(key)
        if failed is not None:
            raise failed
        with self._lock:
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:
            served = self._models.get(key)
            if served is not None:
                return served
            local = self.local_dir(key)
            if not has_model(local):
                shutil.rmtree(local, ignore_errors=True)
                if not fetch_tree(self.store, model_key, local):
                    raise FileNotFoundError(f"no model is stored under {model_key}")
            deployment_id, version = key

            def report(_name: str, message: str) -> None:
                self.report(key, message)

            # Its messages name the deployment, as a request's answer does.
            model = SupervisedModel(deployment_id, local, self.process, report)
            try:
                model.start()
            except ModelProblem as e:
                self._failed.put(key, e)
                raise
            started: ServedModel | None = None
            with self._lock:
                if not self._closed:
                    arrivals = self._arrivals.setdefault(deployment_id, Arrivals())
                    started = ServedModel(
                        model, self.batching, f"{deployment_id}-{version}", arrivals
                    )
                    self._models[key] = started
            if started is None:  # the service stopped meanwhile: leave no process behind
                model.close()
                raise ModelUnloaded("the scoring service stopped")
            log.info(
                "started the model process of deployment %s version %s (%s)",
                deployment_id,
                version,
                model_key,
            )
            return started

    def forget(self, deployment_id: str, version: int | None = None) -> None:
        """Stop the model process of that version of the deployment (of every version
        without one) and remove its local copy."""
        with self._lock:
            keys = [
                key
                for key in (*self._models, *self._loading)
                if key[0] == deployment_id and version in (None, key[1])
            ]
            if version is not None:
                keys.append((deployment_id, version))
            gone = [self._models.pop(key, None) for key in set(keys)]
            for key in keys:
                self._loading.pop(key, None)
            if not any(key[0] == deployment_id for key in self._models):
                self._arrivals.pop(deployment_id, None)
        self._failed.forget(lambda key: key[0] == deployment_id and version in (None, key[1]))
        for served in gone:
            if served is not None:
                served.close()
        if version is None:
            shutil.rmtree(self.root / "models" / deployment_id, ignore_errors=True)
        else:
            shutil.rmtree(self.local_dir((deployment_id, version)), ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for key in self.cached_ids():
            with self._lock:
                served = self._models.pop(key, None)
            if served is not None:
                served.close()
