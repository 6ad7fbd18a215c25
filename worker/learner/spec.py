"""What the platform hands one learner: a JSON file (mode 0600, so credentials never
appear in a process listing) read by the learner wrapper, `python -m worker.learner SPEC`.

The same spec drives a learner process of the local backend and a pod's container: it is
the learner contract (what to fetch, what to run, what to store), free of local-only
mechanisms. How the status is reported, how the peers meet and how the command enters its
sandbox are the backend's (worker.learner.host).

Plain dataclasses, not pydantic models (see service.domain.records): the platform wrote
the file; reading it checks the keys, the kinds and the types. The store and log-sink
configurations it holds belong to service.storage.config and service.logs.config.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from service.domain.records import OPT_STR, STR, Secret, SpecError, checked_fields
from service.logs.config import LogSinkConfig
from service.storage.config import BucketLocation, StoreConfig


@dataclass(frozen=True)
class LearnerSpec:
    training_id: str
    learner_id: int
    num_learners: int
    hostname: str
    # The user's command (MPI: mpirun and the ranks' prefix, then the command); run in
    # model_dir with exactly `env`, behind the backend's prefix (its sandbox).
    argv: list[str]
    env: dict[str, str]
    model_dir: str
    data_dir: str
    result_dir: str
    log_dir: str
    checkpoint_dir: str
    model_definition_key: str
    store: StoreConfig
    log_sink: LogSinkConfig
    # trainings/<id>/results/ : RESULT_DIR goes here, this learner's log and LOG_DIR under
    # learner-<i>/.
    results_prefix: str
    upload_results: bool = True
    # The manifest's training_data_reference: downloaded into data_dir (DOWNLOADING).
    training_data: BucketLocation | None = None
    # The manifest's training_results_reference: results and logs are also copied there,
    # under its prefix (training-<id>/), in the layout under results_prefix.
    results_target: BucketLocation | None = None
    # MPI launcher: wait until every other learner has its code and data in place.
    waits_for_peers: bool = False
    stop_grace_seconds: float = 5.0
    # Log bytes this learner may write (live log and training-log.txt); the rest is
    # dropped after one marker line. None: unbounded.
    max_log_bytes: int | None = None
    # Storing results and logs to a store that is unreachable: attempts per upload, with
    # exponential backoff, and the most seconds spent on them (whichever ends first).
    store_attempts: int = 5
    store_retry_seconds: float = 30.0
    # Where this learner's CHECKPOINT_DIR is saved when its command ends (any exit, or a
    # stop), and the saved CHECKPOINT_DIR of the last attempt, restored into it before the
    # command runs (this learner's part of it: see worker.learner.transfers
    # .restored_checkpoints). Backends whose learners share one CHECKPOINT_DIR save and
    # restore it themselves and leave both None.
    checkpoints_prefix: str | None = None
    restore_checkpoints: str | None = None
    # While the command runs: seconds between two syncs of LOG_DIR to the store (its new
    # and changed files, under results_prefix's learner-<i>/logs/), and whether each sync
    # also reads the TensorBoard event files' scalars into the metric points stored at
    # keys.tensorboard_metrics_key (the manifest's `evaluation_metrics: {type: tensorboard}`).
    log_dir_sync_seconds: float = 10.0
    tensorboard_metrics: bool = False
    # The manifest's `evaluation_metrics` regexes, (name, regex) each: applied to the
    # command's output as the log tee writes it, the points stored at keys.log_metrics_key
    # (with LOG_DIR's syncs, and once more at the end).
    log_metrics: tuple[tuple[str, str], ...] = ()

    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        **{
            name: STR
            for name in (
                "training_id",
                "hostname",
                "model_dir",
                "data_dir",
                "result_dir",
                "log_dir",
                "checkpoint_dir",
                "model_definition_key",
                "results_prefix",
            )
        },
        "learner_id": (int,),
        "num_learners": (int,),
        "argv": (list,),
        "env": (dict,),
        "upload_results": (bool,),
        "waits_for_peers": (bool,),
        "stop_grace_seconds": (int, float),
        "max_log_bytes": (int, type(None)),
        "store_attempts": (int,),
        "store_retry_seconds": (int, float),
        "checkpoints_prefix": OPT_STR,
        "restore_checkpoints": OPT_STR,
        "log_dir_sync_seconds": (int, float),
        "tensorboard_metrics": (bool,),
        "log_metrics": (list,),
    }

    @classmethod
    def from_dict(cls, data: Any) -> LearnerSpec:
        values = checked_fields(cls, data, "spec")
        if not all(isinstance(a, str) for a in values["argv"]):
            raise SpecError("spec.argv: a list of strings is expected")
        if not all(isinstance(v, str) for v in values["env"].values()):
            raise SpecError("spec.env: string values are expected")
        pairs = values.get("log_metrics", [])
        if not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in pairs
        ):
            raise SpecError("spec.log_metrics: a list of [name, regex] pairs is expected")
        values["log_metrics"] = tuple((name, regex) for name, regex in pairs)
        values["store"] = StoreConfig.from_dict(values["store"], "spec.store")
        values["log_sink"] = LogSinkConfig.from_dict(values["log_sink"], "spec.log_sink")
        for name in ("training_data", "results_target"):
            if values.get(name) is not None:
                values[name] = BucketLocation.from_dict(values[name], f"spec.{name}")
        return cls(**values)

    def to_json(self) -> str:
        """The spec with the credentials in the clear: for the spec file only."""

        def reveal(value: object) -> str:
            if isinstance(value, Secret):
                return value.get_secret_value()
            raise TypeError(f"{type(value).__name__} is not JSON")

        return json.dumps(asdict(self), default=reveal)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())

    @classmethod
    def read(cls, path: Path) -> LearnerSpec:
        return cls.from_dict(json.loads(path.read_text()))
