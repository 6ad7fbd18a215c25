"""Deployments: deploy a trained TensorFlow model, list, read, delete.

Predictions are served by service.api.predictions (in this process or, with
DLAAS_SCORING_URL, by the scoring service that this API forwards them to).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from sqlalchemy.orm import Session

from service import deployments as service
from service.api.deployment_schemas import DeploymentCreate, DeploymentList, DeploymentOut
from service.api.deps import CurrentTenant, SessionDep, owned_training
from service.db import repository
from service.db.models import Deployment
from service.domain.deployments import DEPLOYMENT_RULE
from service.http.app import PlatformDep

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])


def wake_scoring(
    request: Request,
    deployment_id: str | None = None,
    *,
    version: int | None = None,
    forget: bool = True,
) -> None:
    """Tell a scoring service running in this process: to stop serving the deployment (or
    one `version` of it), or with `forget=False` to read its versions and labels again;
    and to look for work. A separate one finds out from the database at its next look."""
    scoring = getattr(request.app.state, "scoring", None)
    if scoring is None:
        return
    if deployment_id is not None:
        if forget:
            scoring.forget(deployment_id, version)
        else:
            scoring.refresh(deployment_id)
    scoring.kick()


def deployment_out(session: Session, deployment: Deployment) -> DeploymentOut:
    versions, labels = service.version_view(session, deployment.id)
    return DeploymentOut.of(deployment, versions, labels)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DeploymentOut,
    responses={
        409: {"description": f"The training is not COMPLETED. {DEPLOYMENT_RULE}"},
        422: {"description": f"The training holds no TensorFlow SavedModel. {DEPLOYMENT_RULE}"},
    },
)
def create_deployment(
    body: DeploymentCreate,
    tenant: CurrentTenant,
    platform: PlatformDep,
    session: SessionDep,
    request: Request,
    response: Response,
) -> DeploymentOut:
    """Deploy the training's SavedModel: 202 DEPLOYING, then READY (with its signature) or
    FAILED (with the reason) once the model is loaded and answered a warm-up call."""
    training = owned_training(session, tenant, body.training_id)
    deployment = service.create_deployment(
        session, platform.store, platform.catalog, tenant, training, body.name
    )
    session.commit()
    wake_scoring(request)
    response.headers["Location"] = f"/v1/deployments/{deployment.id}"
    return deployment_out(session, deployment)


@router.get("", response_model=DeploymentList)
def list_deployments(tenant: CurrentTenant, session: SessionDep) -> DeploymentList:
    """The tenant's deployments, newest first."""
    rows = repository.list_deployments(session, tenant.id)
    ids = [d.id for d in rows]
    versions, labels = repository.versions_of(session, ids), repository.labels_of(session, ids)
    return DeploymentList(
        items=[
            DeploymentOut.of(d, versions[d.id], {x.label: x.version for x in labels[d.id]})
            for d in rows
        ]
    )


@router.get("/{deployment_id}", response_model=DeploymentOut)
def get_deployment(deployment_id: str, tenant: CurrentTenant, session: SessionDep) -> DeploymentOut:
    """The deployment, its versions and its labels."""
    return deployment_out(session, service.owned_deployment(session, tenant, deployment_id))


@router.delete("/{deployment_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_deployment(
    deployment_id: str,
    tenant: CurrentTenant,
    platform: PlatformDep,
    session: SessionDep,
    request: Request,
) -> Response:
    """Stop serving the model and delete the deployment; its predictions are 404 after."""
    deployment = service.owned_deployment(session, tenant, deployment_id)
    service.delete_deployment(session, platform.store, deployment)
    session.commit()
    wake_scoring(request, deployment_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
