"""What the API does with deployments: accept one (checking the rule), find the one a
prediction is for, delete one. No TensorFlow here: the model is loaded by the scoring
service (service.scoring), in this process or in its own.

Services never commit; the request that calls them owns the transaction.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.auth import TenantRef, new_id
from service.db import repository
from service.db.models import Deployment, Training, utcnow
from service.domain import quotas
from service.domain.catalog import Catalog
from service.domain.deployments import DeploymentState, ScoringTarget, check_deployable
from service.domain.signature import signatures_from_json
from service.errors import Conflict, FieldError, LimitExceeded, NotFound
from service.storage import keys
from service.storage.base import ObjectStore


def create_deployment(
    session: Session,
    store: ObjectStore,
    catalog: Catalog,
    tenant: TenantRef,
    training: Training,
    name: str | None,
) -> Deployment:
    """Insert the deployment DEPLOYING; a scoring service copies and loads the model.
    LimitExceeded if the tenant keeps as many deployments as the plan allows."""
    plan = catalog.plans.get(tenant.plan)
    if plan is not None:
        kept = repository.tenant_deployment_count(session, tenant.id)
        if reached := quotas.check_deployments(tenant.plan, plan, kept):
            raise LimitExceeded(reached.limit, reached.message)
    has_model = store.stat(keys.saved_model_key(training.id)) is not None
    check_deployable(
        training.id,
        training.status,
        training.framework_name,
        has_model,
        native_tensorflow=catalog.native_tensorflow(training.framework_name),
    )
    deployment_id = new_id()
    now = utcnow()
    deployment = Deployment(
        id=deployment_id,
        tenant_id=tenant.id,
        training_id=training.id,
        name=_free_name(session, tenant, name, training.name),
        status=DeploymentState.DEPLOYING,
        status_message="loading the model",
        model_key=keys.deployment_model_prefix(deployment_id),
        created_at=now,
        updated_at=now,
    )
    session.add(deployment)
    session.flush()
    return deployment


# A default name taken already gets the first free suffix of these.
_MAX_SUFFIX = 1000
_NAME_LENGTH = 128  # Deployment.name's column


def _free_name(session: Session, tenant: TenantRef, name: str | None, default: str) -> str:
    """The new deployment's name, unique among the tenant's deployments (TensorFlow
    Serving's paths address a model by it). A name asked for that is taken is a Conflict
    naming /name; the default (the training's name) takes the first free `-<n>` suffix."""
    if name is not None:
        if repository.deployment_named(session, tenant.id, name) is not None:
            message = f"the tenant has a deployment named '{name}' already; names are unique"
            raise Conflict(f"/name: {message}", errors=[FieldError("/name", message)])
        return name
    candidate = default
    for n in range(2, _MAX_SUFFIX):
        if repository.deployment_named(session, tenant.id, candidate) is None:
            return candidate
        suffix = f"-{n}"
        candidate = default[: _NAME_LENGTH - len(suffix)] + suffix
    message = f"the names '{default}' to '{candidate}' are all taken; name the deployment"
    raise Conflict(f"/name: {message}", errors=[FieldError("/name", message)])


def owned_deployment(session: Session, tenant: TenantRef, deployment_id: str) -> Deployment:
    """The caller's deployment; another tenant's is as absent as a missing one (404)."""
    deployment = repository.get_deployment(session, tenant.id, deployment_id)
    if deployment is None:
        raise NotFound(f"deployment {deployment_id} not found")
    return deployment


def delete_deployment(session: Session, store: ObjectStore, deployment: Deployment) -> None:
    session.delete(deployment)
    session.flush()
    store.delete_prefix(keys.deployment_prefix(deployment.id))


def _find(session: Session, tenant: TenantRef, deployment_id: str, by_name: bool) -> Deployment:
    found = repository.get_deployment(session, tenant.id, deployment_id)
    if found is None and by_name:
        found = repository.deployment_named(session, tenant.id, deployment_id)
    if found is None:
        raise NotFound(f"deployment {deployment_id} not found")
    return found


def serving_state(
    session: Session, tenant: TenantRef, name: str
) -> tuple[ScoringTarget, DeploymentState, str | None]:
    """The caller's deployment `name` (its id or name) whatever its state, with its state
    and status message: what a model status request reports (404 if not the caller's)."""
    deployment = _find(session, tenant, name, True)
    target = ScoringTarget(
        deployment.id, deployment.model_key, signatures_from_json(deployment.signatures)
    )
    return target, DeploymentState(deployment.status), deployment.status_message


def scoring_target(
    session: Session, tenant: TenantRef, deployment_id: str, *, by_name: bool = False
) -> ScoringTarget:
    """The READY deployment a prediction is for; 404 if it is not the caller's, 409 while
    it is not READY. With `by_name`, `deployment_id` may also be the deployment's name
    (TensorFlow Serving's model name): an id is looked for first."""
    deployment = _find(session, tenant, deployment_id, by_name)
    deployment_id = deployment.id
    if deployment.status == DeploymentState.DEPLOYING:
        raise Conflict(
            f"deployment {deployment_id} is DEPLOYING; it answers predictions once READY"
        )
    if deployment.status != DeploymentState.READY:
        raise Conflict(
            f"deployment {deployment_id} is {deployment.status} "
            f"({deployment.status_message}); it answers no predictions"
        )
    return ScoringTarget(
        deployment.id, deployment.model_key, signatures_from_json(deployment.signatures)
    )
