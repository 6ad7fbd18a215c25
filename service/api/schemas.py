"""Response and request bodies of the REST API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from service.db.models import ApiKey, Tenant, Training
from service.db.repository import TrainingView
from service.secrets import masked_document, masked_reference


class TenantCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    plan: str = Field(description="A plan of the catalog: lite or standard by default.")


class TenantOut(BaseModel):
    id: str
    name: str
    plan: str
    created_at: datetime

    @classmethod
    def of(cls, tenant: Tenant) -> TenantOut:
        return cls(id=tenant.id, name=tenant.name, plan=tenant.plan, created_at=tenant.created_at)


class TenantCreated(TenantOut):
    api_key: str = Field(description="Shown once; only its hash is stored.")


class TenantList(BaseModel):
    items: list[TenantOut]


class ApiKeyOut(BaseModel):
    id: str
    prefix: str = Field(description="The key's first characters: enough to recognise it.")
    created: datetime
    last_used: datetime | None = Field(
        description="When it last authenticated a request, to the minute; null: never."
    )
    revoked: datetime | None = Field(description="When it was revoked; null: it is valid.")

    @classmethod
    def of(cls, key: ApiKey) -> ApiKeyOut:
        return cls(
            id=key.id,
            prefix=key.prefix,
            created=key.created_at,
            last_used=key.last_used_at,
            revoked=key.revoked_at,
        )


class ApiKeyCreated(ApiKeyOut):
    api_key: str = Field(description="Shown once; only its hash is stored.")


class ApiKeyList(BaseModel):
    items: list[ApiKeyOut]


class FrameworkOut(BaseModel):
    name: str
    version: str


class ComputeOut(BaseModel):
    name: str
    nodes: int


class LearnerOut(BaseModel):
    learner_id: int
    status: str
    exit_code: int | None


class StatusEventOut(BaseModel):
    status: str
    at: datetime
    message: str | None = None
    attempt: int = Field(default=1, description="The attempt the training was in.")


class PastLearnerOut(BaseModel):
    learner_id: int
    status: str
    exit_code: int | None
    status_message: str | None = None


class AttemptOut(BaseModel):
    """An attempt of a training that was retried, as it ended."""

    attempt: int
    started_at: datetime | None = Field(default=None, description="When it started running.")
    ended_at: datetime
    message: str = Field(description="Why it ended and the next attempt started.")
    learners: list[PastLearnerOut]


class TrainingOut(BaseModel):
    id: str
    name: str
    description: str | None
    status: str
    status_message: str | None
    framework: FrameworkOut
    compute_configuration: ComputeOut
    learners: list[LearnerOut]
    status_history: list[StatusEventOut]
    attempt: int = Field(
        default=1, description="The attempt running or last run: 1, then one more per retry."
    )
    past_attempts: list[AttemptOut] = Field(
        default_factory=list, description="The attempts before it (retry_policy)."
    )
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    max_runtime: int | None = Field(
        default=None, description="Seconds (the manifest's, or the plan's default)."
    )
    stop_requested: bool
    delete_requested: bool
    training_data_reference: dict[str, Any] | None = Field(
        default=None, description="As submitted, with the credentials shown as ***."
    )
    training_results_reference: dict[str, Any] | None = Field(
        default=None, description="As submitted, with the credentials shown as ***."
    )
    manifest: dict[str, Any] = Field(
        default_factory=dict,
        description="The manifest the training runs: the platform's own form (translated "
        "if it was submitted in another format, e.g. FfDL's), credentials shown as ***.",
    )
    submitted_manifest: dict[str, Any] | None = Field(
        default=None,
        description="The manifest as submitted, in its own format, credentials shown as ***.",
    )

    @classmethod
    def of(cls, t: Training | TrainingView) -> TrainingOut:
        return cls(
            id=t.id,
            name=t.name,
            description=t.description,
            status=t.status,
            status_message=t.status_message,
            framework=FrameworkOut(name=t.framework_name, version=t.framework_version),
            compute_configuration=ComputeOut(name=t.compute_name, nodes=t.nodes),
            learners=[
                LearnerOut(learner_id=lr.learner_id, status=lr.status, exit_code=lr.exit_code)
                for lr in t.learners
            ],
            status_history=[
                StatusEventOut(status=e.status, at=e.at, message=e.message, attempt=e.attempt)
                for e in t.events
            ],
            attempt=t.attempt,
            past_attempts=[AttemptOut.model_validate(a) for a in t.past_attempts or ()],
            created_at=t.created_at,
            started_at=t.started_at,
            completed_at=t.completed_at,
            max_runtime=t.manifest.get("max_runtime"),
            stop_requested=t.stop_requested_at is not None,
            delete_requested=t.delete_requested_at is not None,
            training_data_reference=masked_reference(t.manifest.get("training_data_reference")),
            training_results_reference=masked_reference(
                t.manifest.get("training_results_reference")
            ),
            manifest=masked_document(t.manifest),
            submitted_manifest=masked_document(t.submitted_manifest),
        )


class TrainingList(BaseModel):
    items: list[TrainingOut]
    next_cursor: str | None
