"""Request and response bodies of the deployments API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.db.models import Deployment
from service.domain.deployments import SERVING_SIGNATURE
from service.domain.signature import SignatureInfo, TensorInfo, signatures_from_json


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


class DeploymentOut(BaseModel):
    id: str
    name: str
    training_id: str
    status: str = Field(description="DEPLOYING, READY or FAILED")
    status_message: str | None = Field(description="Why it FAILED; what it is doing")
    signature: SignatureOut | None = Field(
        description=f"The '{SERVING_SIGNATURE}' signature, once READY"
    )
    signatures: dict[str, SignatureOut] = Field(
        description="Every signature of the model (requests name one with signature_name)"
    )
    predictions_url: str
    created_at: datetime
    updated_at: datetime
    ready_at: datetime | None

    @classmethod
    def of(cls, d: Deployment) -> DeploymentOut:
        signatures = {n: SignatureOut.of(s) for n, s in signatures_from_json(d.signatures).items()}
        return cls(
            id=d.id,
            name=d.name,
            training_id=d.training_id,
            status=d.status,
            status_message=d.status_message,
            signature=signatures.get(SERVING_SIGNATURE),
            signatures=signatures,
            predictions_url=f"/v1/deployments/{d.id}/predictions",
            created_at=d.created_at,
            updated_at=d.updated_at,
            ready_at=d.ready_at,
        )


class DeploymentList(BaseModel):
    items: list[DeploymentOut]
