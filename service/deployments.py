"""What the API does with deployments: accept one (checking the rule), find the one a
prediction is for, delete one; add versions, point labels at them, unload them. No
TensorFlow here: the models are loaded by the scoring service (service.scoring), in this
process or in its own.

Services never commit; the request that calls them owns the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.auth import TenantRef, new_id
from service.db import repository
from service.db.models import Deployment, DeploymentLabel, DeploymentVersion, Training, utcnow
from service.domain import quotas, versions
from service.domain.catalog import Catalog
from service.domain.deployments import (
    DeploymentState,
    ScoringTarget,
    VersionTarget,
    check_deployable,
)
from service.domain.signature import signatures_from_json
from service.domain.versions import VersionState
from service.errors import Conflict, FieldError, LimitExceeded, NotFound, ValidationFailed
from service.storage import keys
from service.storage.base import ObjectStore


def training_exports(store: ObjectStore, training_id: str) -> dict[int, str]:
    """The SavedModels a training's results export: version -> its store prefix."""
    results = keys.results_prefix(training_id)
    if _has_onnx(store, training_id) or store.stat(keys.saved_model_key(training_id)) is not None:
        found = {1: keys.saved_model_prefix(training_id)[len(results) :]}
    else:
        found = versions.exported_versions(info.key[len(results) :] for info in store.list(results))
    return {n: results + directory for n, directory in found.items()}


def _has_onnx(store: ObjectStore, training_id: str) -> bool:
    """Whether a training's results hold model/model.onnx (version 1, whatever trained it)."""
    return store.stat(keys.onnx_model_key(training_id)) is not None


def _checked_exports(store: ObjectStore, catalog: Catalog, training: Training) -> dict[int, str]:
    exports = training_exports(store, training.id)
    check_deployable(
        training.id,
        training.status,
        training.framework_name,
        bool(exports),
        native_tensorflow=catalog.native_tensorflow(training.framework_name),
        has_onnx_model=_has_onnx(store, training.id),
    )
    return exports


# Tries of an insert whose name another request took between the check and the insert.
_NAME_RACES = 3


def create_deployment(
    session: Session,
    store: ObjectStore,
    catalog: Catalog,
    tenant: TenantRef,
    training: Training,
    name: str | None,
) -> Deployment:
    """Insert the deployment DEPLOYING; a scoring service copies and loads the model.
    LimitExceeded if the tenant keeps as many deployments as the plan allows.

    Names are unique per tenant (the database's index, `uq_deployments_tenant_name`): a
    request that loses the name to another one made at the same time, between its check
    and its insert, is rolled back and checked again, so an asked-for name is the same
    Conflict as one taken before, and a default name takes the next free suffix."""
    for _ in range(_NAME_RACES):
        exports = _checked_for(session, store, catalog, tenant, training)
        deployment = _new_deployment(session, tenant, training, name, max(exports))
        session.add(deployment)
        try:
            session.flush()
        except IntegrityError:
            session.rollback()
            if repository.deployment_named(session, tenant.id, deployment.name) is None:
                raise  # not the name: nothing else is unique but the id, which is new
            continue
        for number, source in exports.items():
            session.add(
                _new_version(deployment.id, number, training.id, source, deployment.created_at)
            )
        session.flush()
        return deployment
    message = "other deployments took each name tried for this one; try again"
    raise Conflict(f"/name: {message}", errors=[FieldError("/name", message)])


def _checked_for(
    session: Session, store: ObjectStore, catalog: Catalog, tenant: TenantRef, training: Training
) -> dict[int, str]:
    """The SavedModels (version -> store prefix) a new deployment of `training` serves,
    after the plan's and the deployment rule's checks."""
    plan = catalog.plans.get(tenant.plan)
    if plan is not None:
        kept = repository.tenant_deployment_count(session, tenant.id)
        if reached := quotas.check_deployments(tenant.plan, plan, kept):
            raise LimitExceeded(reached.limit, reached.message)
    exports = _checked_exports(store, catalog, training)
    if len(exports) > versions.MAX_LOADED_VERSIONS:
        problem = (
            f"the results of training {training.id} export {len(exports)} versions; a "
            f"deployment loads at most {versions.MAX_LOADED_VERSIONS} at once"
        )
        raise ValidationFailed([FieldError("training_id", problem)], detail=problem)
    return exports


def _new_deployment(
    session: Session, tenant: TenantRef, training: Training, name: str | None, latest: int
) -> Deployment:
    deployment_id = new_id()
    now = utcnow()
    return Deployment(
        id=deployment_id,
        tenant_id=tenant.id,
        training_id=training.id,
        name=_free_name(session, tenant, name, training.name),
        status=DeploymentState.DEPLOYING,
        status_message="loading the model",
        model_key=keys.deployment_version_prefix(deployment_id, latest),
        created_at=now,
        updated_at=now,
    )


def _new_version(
    deployment_id: str, number: int, training_id: str, source: str, now: datetime
) -> DeploymentVersion:
    return DeploymentVersion(
        deployment_id=deployment_id,
        version=number,
        training_id=training_id,
        source_key=source,
        model_key=keys.deployment_version_prefix(deployment_id, number),
        state=VersionState.DEPLOYING,
        status_message="loading the model",
        created_at=now,
        updated_at=now,
    )


def _states(rows: Sequence[DeploymentVersion]) -> dict[int, VersionState]:
    return {row.version: VersionState(row.state) for row in rows}


def _labels(rows: Sequence[DeploymentLabel]) -> dict[str, int]:
    return {row.label: row.version for row in rows}


def _locked(session: Session, deployment: Deployment) -> None:
    """Take the deployment's row lock: its versions and labels change one request at a
    time."""
    repository.lock_deployment(session, deployment.id)


def add_version(
    session: Session,
    store: ObjectStore,
    catalog: Catalog,
    deployment: Deployment,
    training: Training,
) -> DeploymentVersion:
    """Insert the deployment's next version DEPLOYING, from `training`'s SavedModel (its
    highest version where it exports several); a scoring service loads it. The rules of a
    first deployment apply (check_deployable), the deployment must be READY, and it may
    load only so many versions at once."""
    _locked(session, deployment)
    if deployment.status != DeploymentState.READY:
        raise Conflict(
            f"deployment {deployment.id} is {deployment.status}; versions are added to a "
            "READY deployment",
            errors=[FieldError("/training_id", f"deployment {deployment.id} is not READY")],
        )
    exports = _checked_exports(store, catalog, training)
    rows = repository.deployment_versions(session, deployment.id)
    versions.check_addable(deployment.id, _states(rows))
    number = versions.next_version(row.version for row in rows)
    version = _new_version(
        deployment.id, number, training.id, versions.latest_export(exports), utcnow()
    )
    session.add(version)
    session.flush()
    return version


def set_label(session: Session, deployment: Deployment, label: str, version: int) -> None:
    """Point `label` at `version` (a loaded one), creating or moving it."""
    versions.check_label_name(label)
    _locked(session, deployment)
    states = _states(repository.deployment_versions(session, deployment.id))
    versions.check_label_target(deployment.id, states, version)
    repository.set_label(session, deployment.id, label, version)


def delete_label(session: Session, deployment: Deployment, label: str) -> None:
    _locked(session, deployment)
    if not repository.delete_label(session, deployment.id, label):
        raise NotFound(
            f"deployment {deployment.id} has no label '{label}'",
            errors=[FieldError("label", f"no label '{label}'")],
        )


def unload_version(
    session: Session, store: ObjectStore, deployment: Deployment, version: int
) -> bool:
    """Record the version UNLOADED and delete its stored copy (scoring processes stop its
    model process); refused while a label points at it. Returns whether anything
    changed."""
    _locked(session, deployment)
    rows = repository.deployment_versions(session, deployment.id)
    states = _states(rows)
    labels = _labels(repository.deployment_labels(session, deployment.id))
    if not versions.check_unload(deployment.id, states, labels, version):
        return False
    row = next(r for r in rows if r.version == version)
    now = utcnow()
    row.state = VersionState.UNLOADED
    row.unloaded_at = now
    row.updated_at = now
    session.flush()
    store.delete_prefix(row.model_key)
    return True


def version_view(
    session: Session, deployment_id: str
) -> tuple[list[DeploymentVersion], dict[str, int]]:
    """A deployment's versions (by number) and labels (label -> version)."""
    rows = list(repository.deployment_versions(session, deployment_id))
    return rows, _labels(repository.deployment_labels(session, deployment_id))


def default_version(rows: Sequence[DeploymentVersion], labels: dict[str, int]) -> int | None:
    """The version a request that names none gets now (None when none is loaded)."""
    return versions.default_version(_states(rows), labels)


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
    targets, labels, chosen = _version_targets(session, deployment)
    target = ScoringTarget(
        deployment.id,
        deployment.model_key,
        signatures_from_json(deployment.signatures),
        version=chosen or max(targets, default=1),
        versions=targets,
        labels=labels,
    )
    return target, DeploymentState(deployment.status), deployment.status_message


def _version_targets(
    session: Session, deployment: Deployment
) -> tuple[dict[int, VersionTarget], dict[str, int], int | None]:
    """The deployment's versions as scoring sees them, its labels, and the version a
    request that names none gets now (None when none is loaded)."""
    rows, labels = version_view(session, deployment.id)
    targets = {
        row.version: VersionTarget(
            row.version, row.state, row.model_key, signatures_from_json(row.signatures)
        )
        for row in rows
    }
    return targets, labels, default_version(rows, labels)


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
    targets, labels, chosen = _version_targets(session, deployment)
    if chosen is None:
        raise Conflict(
            f"deployment {deployment_id} has no loaded version; it answers no predictions"
        )
    return ScoringTarget(
        deployment.id,
        targets[chosen].model_key,
        targets[chosen].signatures,
        version=chosen,
        versions=targets,
        labels=labels,
    )
