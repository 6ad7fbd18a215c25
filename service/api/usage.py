"""The tenant's use against its plan's limits."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from service.api.deps import CurrentTenant, SessionDep
from service.db import repository
from service.domain.states import ACTIVE_STATES, TrainingState
from service.errors import Conflict
from service.http.app import PlatformDep

router = APIRouter(prefix="/v1/usage", tags=["usage"])


class Use(BaseModel):
    used: int
    limit: int


class RuntimeLimits(BaseModel):
    default: int = Field(description="Seconds a training runs at most if it names no max_runtime.")
    maximum: int = Field(description="The largest max_runtime a manifest may name, seconds.")


class UsageOut(BaseModel):
    tenant_id: str
    plan: str
    queued_trainings: Use = Field(description="QUEUED trainings; more are refused (429).")
    active_trainings: Use = Field(
        description="Trainings past QUEUED and not ended; more wait in the queue."
    )
    active_nodes: Use = Field(
        description="Learner slots (nodes) the tenant's active trainings hold, against the "
        "plan's max_active_nodes; a training that would go over waits in the queue."
    )
    deployments: Use = Field(description="Deployments kept, any status; more are refused (429).")
    stored_bytes: Use = Field(
        description="Code archives and results of the tenant's trainings; a submission "
        "that would go over is refused (429)."
    )
    max_runtime: RuntimeLimits


@router.get("", response_model=UsageOut)
def get_usage(tenant: CurrentTenant, platform: PlatformDep, session: SessionDep) -> UsageOut:
    """What the tenant uses now, against what its plan allows."""
    plan = platform.catalog.plans.get(tenant.plan)
    if plan is None:
        raise Conflict(f"plan '{tenant.plan}' is not offered; ask the operator")
    return UsageOut(
        tenant_id=tenant.id,
        plan=tenant.plan,
        queued_trainings=Use(
            used=repository.tenant_training_count(session, tenant.id, TrainingState.QUEUED),
            limit=plan.max_queued_trainings,
        ),
        active_trainings=Use(
            used=repository.tenant_training_count(session, tenant.id, *ACTIVE_STATES),
            limit=plan.max_concurrent_trainings,
        ),
        active_nodes=Use(
            used=repository.tenant_active_nodes(session, tenant.id),
            limit=plan.active_nodes_limit,
        ),
        deployments=Use(
            used=repository.tenant_deployment_count(session, tenant.id),
            limit=plan.max_deployments,
        ),
        stored_bytes=Use(
            used=repository.tenant_stored_bytes(session, tenant.id), limit=plan.max_stored_bytes
        ),
        max_runtime=RuntimeLimits(default=plan.default_max_runtime, maximum=plan.max_max_runtime),
    )
