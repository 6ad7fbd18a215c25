"""What the platform hands one learner: a JSON file (mode 0600, so credentials never
appear in a process listing) read by the learner wrapper, `python -m worker.learner SPEC`.

The same spec drives a learner process of the local backend and a pod's container.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, field_serializer


class StoreConfig(BaseModel):
    """How to reach an object store (see service.storage): the platform's, or a user's
    bucket. The credentials print as '**********'; only the spec file holds them."""

    kind: Literal["local", "s3"]
    root: str | None = None  # local
    endpoint: str | None = None  # s3
    access_key: SecretStr | None = None
    secret_key: SecretStr | None = None
    bucket: str | None = None
    region: str | None = None

    @field_serializer("access_key", "secret_key", when_used="json")
    def _reveal(self, value: SecretStr | None) -> str | None:
        return value.get_secret_value() if value is not None else None


class BucketLocation(BaseModel):
    """A directory in a user's bucket: training data to fetch, or where results go."""

    store: StoreConfig
    prefix: str = ""


class LogSinkConfig(BaseModel):
    """Where the learner's log lines go live (see service.logs)."""

    kind: Literal["file", "redis"]
    dir: str | None = None  # file
    url: str | None = None  # redis


class MetricConfig(BaseModel):
    name: str
    regex: str


class LearnerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    training_id: str
    learner_id: int
    num_learners: int
    hostname: str
    # The full command, prefixes included (e.g. entering the learner's namespaces); run in
    # model_dir with exactly `env`.
    argv: list[str]
    env: dict[str, str]
    model_dir: str
    data_dir: str
    result_dir: str
    log_dir: str
    checkpoint_dir: str
    status_file: str
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
    # Rendezvous (MPI launcher learner): create ready_file once the code is in place; wait
    # for every file of wait_for before running the command.
    ready_file: str | None = None
    wait_for: list[str] = []
    wait_timeout: float = 600.0
    stop_grace_seconds: float = 5.0

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.model_dump_json())

    @classmethod
    def read(cls, path: Path) -> LearnerSpec:
        data: dict[str, Any] = json.loads(path.read_text())
        return cls.model_validate(data)
