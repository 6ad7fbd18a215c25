"""Request and response bodies of the deployments API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.db.models import Deployment, DeploymentVersion
from service.domain.deployments import SERVING_SIGNATURE
from service.domain.signature import SignatureInfo, TensorInfo, signatures_from_json
from service.domain.versions import MAX_VERSION, VersionState, default_version


class DeploymentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    training_id: str = Field(
        min_length=1, max_length=32, description="A COMPLETED training with a SavedModel."
    )
    name: str | None = Field(
        default=None, min_length=1, max_length=128, description="Default: the training's name."
    )


class TensorOut(BaseModel):
    name: str
    dtype: str = Field(description="float32, int64, string, bool, ...")
    shape: list[int | None] | None = Field(
        description="null for a dimension of any size (the first is the batch); "
        "null for an unknown rank"
    )

    @classmethod
    def of(cls, t: TensorInfo) -> TensorOut:
        return cls(name=t.name, dtype=t.dtype, shape=None if t.shape is None else list(t.shape))


class SignatureOut(BaseModel):
    inputs: list[TensorOut]
    outputs: list[TensorOut]

    @classmethod
    def of(cls, s: SignatureInfo) -> SignatureOut:
        return cls(
            inputs=[TensorOut.of(t) for t in s.inputs.values()],
            outputs=[TensorOut.of(t) for t in s.outputs.values()],
        )


class VersionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    training_id: str = Field(
        min_length=1,
        max_length=32,
        description="A COMPLETED training with a SavedModel (its highest version where it "
        "exports several): the deployment's next version.",
    )


class LabelSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=MAX_VERSION, description="A loaded (READY) version.")


class LabelOut(BaseModel):
    label: str
    version: int


class VersionOut(BaseModel):
    version: int
    training_id: str
    state: str = Field(description="DEPLOYING, READY (loaded), FAILED or UNLOADED")
    status_message: str | None = Field(description="Why it FAILED; what it is doing")
    labels: list[str] = Field(description="The labels that point at it")
    signatures: dict[str, SignatureOut]
    created_at: datetime
    loaded_at: datetime | None
    unloaded_at: datetime | None

    @classmethod
    def of(cls, v: DeploymentVersion, labels: dict[str, int]) -> VersionOut:
        signatures = signatures_from_json(v.signatures)
        return cls(
            version=v.version,
            training_id=v.training_id,
            state=v.state,
            status_message=v.status_message,
            labels=sorted(name for name, target in labels.items() if target == v.version),
            signatures={n: SignatureOut.of(s) for n, s in signatures.items()},
            created_at=v.created_at,
            loaded_at=v.loaded_at,
            unloaded_at=v.unloaded_at,
        )


class VersionList(BaseModel):
    items: list[VersionOut] = Field(description="The deployment's versions, by number")
    labels: dict[str, int] = Field(description="label -> the version it points at")
    default_version: int | None = Field(
        description="What a request that names no version gets: the 'stable' label's "
        "version where it is set, else the latest loaded one"
    )

    @classmethod
    def of(cls, versions: list[DeploymentVersion], labels: dict[str, int]) -> VersionList:
        return cls(
            items=[VersionOut.of(v, labels) for v in versions],
            labels=labels,
            default_version=_default(versions, labels),
        )


def _default(versions: list[DeploymentVersion], labels: dict[str, int]) -> int | None:
    return default_version({v.version: VersionState(v.state) for v in versions}, labels)


class DeploymentOut(BaseModel):
    id: str
    name: str
    training_id: str
    status: str = Field(description="DEPLOYING, READY or FAILED")
    status_message: str | None = Field(description="Why it FAILED; what it is doing")
    signature: SignatureOut | None = Field(
        description=f"The '{SERVING_SIGNATURE}' signature (of the default version), once READY"
    )
    signatures: dict[str, SignatureOut] = Field(
        description="Every signature of the model's default version (requests name one "
        "with signature_name)"
    )
    default_version: int | None = Field(
        description="What a request that names no version gets: the 'stable' label's "
        "version where it is set, else the latest loaded one"
    )
    versions: list[VersionOut] = Field(description="The deployment's versions, by number")
    labels: dict[str, int] = Field(description="label -> the version it points at")
    predictions_url: str
    created_at: datetime
    updated_at: datetime
    ready_at: datetime | None

    @classmethod
    def of(
        cls,
        d: Deployment,
        versions: list[DeploymentVersion] | None = None,
        labels: dict[str, int] | None = None,
    ) -> DeploymentOut:
        versions, labels = versions or [], labels or {}
        default = _default(versions, labels)
        shown = next((v.signatures for v in versions if v.version == default), d.signatures)
        signatures = {n: SignatureOut.of(s) for n, s in signatures_from_json(shown).items()}
        return cls(
            id=d.id,
            name=d.name,
            training_id=d.training_id,
            status=d.status,
            status_message=d.status_message,
            signature=signatures.get(SERVING_SIGNATURE),
            signatures=signatures,
            default_version=default,
            versions=[VersionOut.of(v, labels) for v in versions],
            labels=labels,
            predictions_url=f"/v1/deployments/{d.id}/predictions",
            created_at=d.created_at,
            updated_at=d.updated_at,
            ready_at=d.ready_at,
        )


class DeploymentList(BaseModel):
    items: list[DeploymentOut]
