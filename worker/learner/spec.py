"""What the platform hands one learner: a JSON file (mode 0600, so credentials never
appear in a process listing) read by the learner wrapper, `python -m worker.learner SPEC`.

The same spec drives a learner process of the local backend and a pod's container.

Plain dataclasses, not pydantic models: every learner's wrapper imports this module before
its command can start, and building pydantic models cost 0.13 s of that start (the
platform wrote the file; reading it checks the keys, the kinds and the types).
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol


class _HasSecret(Protocol):
    def get_secret_value(self) -> str: ...


class Secret:
    """A credential: prints as '**********', only the spec file holds its value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    @classmethod
    def of(cls, value: str | _HasSecret | None) -> Secret | None:
        if value is None:
            return None
        return cls(value if isinstance(value, str) else value.get_secret_value())

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __str__(self) -> str:
        return "**********"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class SpecError(ValueError):
    """The spec file is not one this version of the platform writes."""


def _check(cls: type[Any], data: Any, where: str) -> dict[str, Any]:
    """`data` as keyword arguments of dataclass `cls`: an object with only its fields, all
    the required ones, each of the type the class declares (see _TYPES)."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected an object")
    known = {f.name: f for f in fields(cls)}
    if unknown := sorted(set(data) - set(known)):
        raise SpecError(f"{where}: unknown keys {unknown}")
    for name, f in known.items():
        required = f.default is MISSING and f.default_factory is MISSING
        if required and name not in data:
            raise SpecError(f"{where}: {name} is required")
        expected = cls._TYPES.get(name)
        value = data.get(name)
        if name in data and expected is not None and not isinstance(value, expected):
            raise SpecError(f"{where}.{name}: {type(value).__name__} is not allowed here")
    return dict(data)


_STR = (str,)
_OPT_STR = (str, type(None))


class _OfKind:
    """A configuration whose `kind` must be one of KINDS."""

    NAME: ClassVar[str]
    KINDS: ClassVar[tuple[str, ...]]
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise SpecError(f"{self.NAME}.kind: {self.kind!r} is not one of {list(self.KINDS)}")


@dataclass(frozen=True)
class StoreConfig(_OfKind):
    """How to reach an object store (see service.storage): the platform's, or a user's
    bucket."""

    kind: str  # "local" or "s3"
    root: str | None = None  # local
    endpoint: str | None = None  # s3
    access_key: Secret | None = None
    secret_key: Secret | None = None
    bucket: str | None = None
    region: str | None = None

    NAME: ClassVar[str] = "store"
    KINDS: ClassVar[tuple[str, ...]] = ("local", "s3")
    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        "kind": _STR,
        "root": _OPT_STR,
        "endpoint": _OPT_STR,
        "access_key": _OPT_STR,
        "secret_key": _OPT_STR,
        "bucket": _OPT_STR,
        "region": _OPT_STR,
    }

    @classmethod
    def from_dict(cls, data: Any, where: str = "store") -> StoreConfig:
        values = _check(cls, data, where)
        for key in ("access_key", "secret_key"):
            values[key] = Secret.of(values.get(key))
        return cls(**values)


@dataclass(frozen=True)
class BucketLocation:
    """A directory in a user's bucket: training data to fetch, or where results go."""

    store: StoreConfig
    prefix: str = ""

    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {"prefix": _STR}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> BucketLocation:
        values = _check(cls, data, where)
        values["store"] = StoreConfig.from_dict(values["store"], f"{where}.store")
        return cls(**values)


@dataclass(frozen=True)
class LogSinkConfig(_OfKind):
    """Where the learner's log lines go live (see service.logs)."""

    kind: str  # "file" or "redis"
    dir: str | None = None  # file
    url: str | None = None  # redis

    NAME: ClassVar[str] = "log_sink"
    KINDS: ClassVar[tuple[str, ...]] = ("file", "redis")
    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        "kind": _STR,
        "dir": _OPT_STR,
        "url": _OPT_STR,
    }

    @classmethod
    def from_dict(cls, data: Any, where: str = "log_sink") -> LogSinkConfig:
        return cls(**_check(cls, data, where))


@dataclass(frozen=True)
class LearnerSpec:
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
    wait_for: list[str] = field(default_factory=list)
    wait_timeout: float = 600.0
    stop_grace_seconds: float = 5.0
    # A Unix datagram socket to tell the backend's monitor that the status file changed.
    notify_socket: str | None = None

    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        **{
            name: _STR
            for name in (
                "training_id",
                "hostname",
                "model_dir",
                "data_dir",
                "result_dir",
                "log_dir",
                "checkpoint_dir",
                "status_file",
                "model_definition_key",
                "results_prefix",
            )
        },
        "learner_id": (int,),
        "num_learners": (int,),
        "argv": (list,),
        "env": (dict,),
        "upload_results": (bool,),
        "ready_file": _OPT_STR,
        "wait_for": (list,),
        "wait_timeout": (int, float),
        "notify_socket": _OPT_STR,
        "stop_grace_seconds": (int, float),
    }

    @classmethod
    def from_dict(cls, data: Any) -> LearnerSpec:
        values = _check(cls, data, "spec")
        for name in ("argv", "wait_for"):
            if not all(isinstance(a, str) for a in values.get(name, [])):
                raise SpecError(f"spec.{name}: a list of strings is expected")
        if not all(isinstance(v, str) for v in values["env"].values()):
            raise SpecError("spec.env: string values are expected")
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
