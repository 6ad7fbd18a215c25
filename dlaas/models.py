"""Typed results of the client: immutable dataclasses built from the API's JSON.

Each keeps the document it was read from in `raw` (what `dlaas ... --json` prints), so a
field the API adds later is never lost on the way through the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

T = TypeVar("T")

TRAINING_STATES = (
    "QUEUED",
    "PENDING",
    "DOWNLOADING",
    "RUNNING",
    "STORING",
    "COMPLETED",
    "FAILED",
    "HALTED",
)
TERMINAL_TRAINING_STATES = frozenset({"COMPLETED", "FAILED", "HALTED"})
DEPLOYMENT_STATES = ("DEPLOYING", "READY", "FAILED")
FINAL_DEPLOYMENT_STATES = frozenset({"READY", "FAILED"})


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _required_time(value: Any) -> datetime:
    parsed = _time(value)
    if parsed is None:
        raise ValueError("missing timestamp in the API's answer")
    return parsed


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Framework:
    name: str
    version: str


@dataclass(frozen=True)
class ComputeConfiguration:
    name: str
    nodes: int


@dataclass(frozen=True)
class Learner:
    learner_id: int
    status: str
    exit_code: int | None = None
    # Why it ended as it did: `the workers completed` for one the platform STOPPED when
    # the training's workers completed (a parameter server, an MPI host).
    status_message: str | None = None


@dataclass(frozen=True)
class StatusEvent:
    status: str
    at: datetime
    message: str | None = None
    attempt: int = 1


@dataclass(frozen=True)
class PastLearner:
    learner_id: int
    status: str
    exit_code: int | None = None
    status_message: str | None = None


@dataclass(frozen=True)
class Attempt:
    """An attempt of a retried training, as it ended."""

    attempt: int
    ended_at: datetime
    message: str
    learners: tuple[PastLearner, ...]
    started_at: datetime | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        return cls(
            attempt=int(data["attempt"]),
            ended_at=_required_time(data["ended_at"]),
            message=str(data.get("message") or ""),
            started_at=_time(data.get("started_at")),
            learners=tuple(
                PastLearner(
                    int(lr["learner_id"]),
                    str(lr["status"]),
                    lr.get("exit_code"),
                    _str_or_none(lr.get("status_message")),
                )
                for lr in data.get("learners") or []
            ),
        )


@dataclass(frozen=True)
class Training:
    """A training as `GET /v1/trainings/{id}` describes it."""

    id: str
    name: str
    status: str
    status_message: str | None
    framework: Framework
    compute_configuration: ComputeConfiguration
    learners: tuple[Learner, ...]
    status_history: tuple[StatusEvent, ...]
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    description: str | None = None
    stop_requested: bool = False
    delete_requested: bool = False
    max_runtime: int | None = None
    # 1, then one more per retry (the manifest's retry_policy); the attempts before it.
    attempt: int = 1
    past_attempts: tuple[Attempt, ...] = ()
    # What could not be enforced as the compute configuration asks on the machine that
    # ran it (resource limits, isolation): said once, here.
    limits_note: str | None = None
    # The manifest the training runs (the platform's form, translated from FfDL's where it
    # was submitted in that format) and the one submitted, as sent; credentials "***".
    manifest: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    submitted_manifest: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        """Whether the training has ended (COMPLETED, FAILED or HALTED): final."""
        return self.status in TERMINAL_TRAINING_STATES

    @property
    def succeeded(self) -> bool:
        return self.status == "COMPLETED"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Training:
        fw = data.get("framework") or {}
        compute = data.get("compute_configuration") or {}
        return cls(
            id=str(data["id"]),
            name=str(data.get("name", "")),
            description=_str_or_none(data.get("description")),
            status=str(data["status"]),
            status_message=_str_or_none(data.get("status_message")),
            limits_note=_str_or_none(data.get("limits_note")),
            framework=Framework(str(fw.get("name", "")), str(fw.get("version", ""))),
            compute_configuration=ComputeConfiguration(
                str(compute.get("name", "")), int(compute.get("nodes", 0))
            ),
            learners=tuple(
                Learner(
                    int(lr["learner_id"]),
                    str(lr["status"]),
                    lr.get("exit_code"),
                    _str_or_none(lr.get("status_message")),
                )
                for lr in data.get("learners") or []
            ),
            status_history=tuple(
                StatusEvent(
                    str(e["status"]),
                    _required_time(e["at"]),
                    e.get("message"),
                    int(e.get("attempt") or 1),
                )
                for e in data.get("status_history") or []
            ),
            created_at=_required_time(data["created_at"]),
            started_at=_time(data.get("started_at")),
            completed_at=_time(data.get("completed_at")),
            stop_requested=bool(data.get("stop_requested", False)),
            delete_requested=bool(data.get("delete_requested", False)),
            max_runtime=None if data.get("max_runtime") is None else int(data["max_runtime"]),
            attempt=int(data.get("attempt") or 1),
            past_attempts=tuple(Attempt.from_json(a) for a in data.get("past_attempts") or []),
            manifest=dict(data.get("manifest") or {}),
            submitted_manifest=data.get("submitted_manifest"),
            raw=data,
        )


@dataclass(frozen=True)
class MetricPoint:
    """One value of an evaluation metric, read from a learner's log line."""

    value: float
    learner: int
    timestamp: datetime
    step: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MetricPoint:
        step = data.get("step")
        return cls(
            value=float(data["value"]),
            learner=int(data["learner"]),
            timestamp=_required_time(data["timestamp"]),
            step=None if step is None else int(step),
        )


@dataclass(frozen=True)
class ResultFile:
    """One stored result of a training (`path` relative to its results)."""

    path: str
    size: int | None = None
    last_modified: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResultFile:
        size = data.get("size")
        return cls(
            path=str(data["path"]),
            size=None if size is None else int(size),
            last_modified=_time(data.get("last_modified")),
            raw=data,
        )


@dataclass(frozen=True)
class Use:
    """How much of one limit of the plan is used."""

    used: int
    limit: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Use:
        return cls(used=int(data["used"]), limit=int(data["limit"]))


@dataclass(frozen=True)
class Usage:
    """The tenant's use against its plan (`GET /v1/usage`). `default_max_runtime` is what
    a training naming no max_runtime gets, `max_max_runtime` the most one may name
    (seconds)."""

    tenant_id: str
    plan: str
    queued_trainings: Use
    active_trainings: Use
    deployments: Use
    stored_bytes: Use
    default_max_runtime: int
    max_max_runtime: int
    # The learner slots the tenant's active trainings hold, against the plan's
    # max_active_nodes (None from a server that does not say).
    active_nodes: Use | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Usage:
        runtime = data["max_runtime"]
        return cls(
            tenant_id=str(data["tenant_id"]),
            plan=str(data["plan"]),
            queued_trainings=Use.from_json(data["queued_trainings"]),
            active_trainings=Use.from_json(data["active_trainings"]),
            deployments=Use.from_json(data["deployments"]),
            stored_bytes=Use.from_json(data["stored_bytes"]),
            default_max_runtime=int(runtime["default"]),
            max_max_runtime=int(runtime["maximum"]),
            active_nodes=Use.from_json(data["active_nodes"]) if "active_nodes" in data else None,
            raw=data,
        )


@dataclass(frozen=True)
class Tenant:
    """A tenant; `api_key` is set only in the answer to its creation (shown once)."""

    id: str
    name: str
    plan: str
    created_at: datetime | None = None
    api_key: str | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tenant:
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            plan=str(data["plan"]),
            created_at=_time(data.get("created_at")),
            api_key=_str_or_none(data.get("api_key")),
            raw=data,
        )


@dataclass(frozen=True)
class ApiKey:
    """One of a tenant's API keys, as listed: never the key itself, but its first
    characters (`prefix`). `api_key` is set only in the answer to its creation (shown
    once). `revoked` is when it was revoked, None while it is valid."""

    id: str
    prefix: str
    created: datetime | None = None
    last_used: datetime | None = None
    revoked: datetime | None = None
    api_key: str | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def valid(self) -> bool:
        """Whether the key still authenticates (it is not revoked)."""
        return self.revoked is None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ApiKey:
        return cls(
            id=str(data["id"]),
            prefix=str(data["prefix"]),
            created=_time(data.get("created")),
            last_used=_time(data.get("last_used")),
            revoked=_time(data.get("revoked")),
            api_key=_str_or_none(data.get("api_key")),
            raw=data,
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list the API answers in pages (`GET /v1/trainings`): its items and
    the cursor that asks for the next page, None after the last one."""

    items: tuple[T, ...]
    next_cursor: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Tensor:
    """One input or output of a model's signature. `shape` holds None for a dimension of
    any size (the first is the batch); `shape` itself is None for an unknown rank."""

    name: str
    dtype: str
    shape: tuple[int | None, ...] | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tensor:
        shape = data.get("shape")
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=None if shape is None else tuple(None if d is None else int(d) for d in shape),
        )


@dataclass(frozen=True)
class Signature:
    """A signature of a deployed model: what a prediction request sends and gets back."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Signature:
        return cls(
            inputs=tuple(Tensor.from_json(t) for t in data.get("inputs") or []),
            outputs=tuple(Tensor.from_json(t) for t in data.get("outputs") or []),
        )


@dataclass(frozen=True)
class DeploymentVersion:
    """One version of a deployment: DEPLOYING, then READY (loaded) or FAILED; UNLOADED
    once unloaded. `labels` are the labels that point at it."""

    version: int
    training_id: str
    state: str
    status_message: str | None = None
    labels: tuple[str, ...] = ()
    created_at: datetime | None = None
    loaded_at: datetime | None = None
    unloaded_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeploymentVersion:
        return cls(
            version=int(data["version"]),
            training_id=str(data.get("training_id", "")),
            state=str(data["state"]),
            status_message=_str_or_none(data.get("status_message")),
            labels=tuple(str(x) for x in data.get("labels") or ()),
            created_at=_time(data.get("created_at")),
            loaded_at=_time(data.get("loaded_at")),
            unloaded_at=_time(data.get("unloaded_at")),
            raw=data,
        )


@dataclass(frozen=True)
class VersionList:
    """A deployment's versions (by number), its labels (label -> version) and the version
    a request that names none gets."""

    items: tuple[DeploymentVersion, ...]
    labels: dict[str, int]
    default_version: int | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def version(self, number: int) -> DeploymentVersion:
        for item in self.items:
            if item.version == number:
                return item
        raise KeyError(number)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VersionList:
        return cls(
            items=tuple(DeploymentVersion.from_json(v) for v in data.get("items") or ()),
            labels={str(k): int(v) for k, v in (data.get("labels") or {}).items()},
            default_version=_int_or_none(data.get("default_version")),
            raw=data,
        )


@dataclass(frozen=True)
class Deployment:
    """An online deployment of a training's SavedModel: DEPLOYING, then READY or FAILED.
    `signature` is the `serving_default` one once READY (of the default version);
    `signatures` every one, by name; `versions`, `labels` and `default_version` say which
    versions it holds and which one a request that names none gets."""

    id: str
    training_id: str
    status: str
    name: str | None = None
    status_message: str | None = None
    created_at: datetime | None = None
    ready_at: datetime | None = None
    signature: Signature | None = None
    signatures: dict[str, Signature] = field(default_factory=dict, compare=False)
    versions: tuple[DeploymentVersion, ...] = field(default=(), compare=False)
    labels: dict[str, int] = field(default_factory=dict, compare=False)
    default_version: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ready(self) -> bool:
        return self.status == "READY"

    @property
    def final(self) -> bool:
        """Whether the deployment has settled (READY or FAILED)."""
        return self.status in FINAL_DEPLOYMENT_STATES

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Deployment:
        signature = data.get("signature")
        return cls(
            id=str(data["id"]),
            training_id=str(data.get("training_id", "")),
            status=str(data["status"]),
            name=_str_or_none(data.get("name")),
            status_message=_str_or_none(data.get("status_message")),
            created_at=_time(data.get("created_at")),
            ready_at=_time(data.get("ready_at")),
            signature=Signature.from_json(signature) if signature else None,
            signatures={
                str(n): Signature.from_json(s) for n, s in (data.get("signatures") or {}).items()
            },
            versions=tuple(DeploymentVersion.from_json(v) for v in data.get("versions") or ()),
            labels={str(k): int(v) for k, v in (data.get("labels") or {}).items()},
            default_version=_int_or_none(data.get("default_version")),
            raw=data,
        )
