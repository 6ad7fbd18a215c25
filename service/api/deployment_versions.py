"""A deployment's versions and labels: add a version from another training, list them,
unload one; point a label at a loaded version, remove it. Requests pick a version with
the predictions' `version` or `label` parameter (or TensorFlow Serving's model_spec)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response, status

from service import deployments as service
from service.api.deployment_schemas import (
    LabelOut,
    LabelSet,
    VersionCreate,
    VersionList,
    VersionOut,
)
from service.api.deployments import wake_scoring
from service.api.deps import CurrentTenant, SessionDep, owned_training
from service.domain.deployments import DEPLOYMENT_RULE
from service.domain.versions import LABEL_RULE, MAX_VERSION
from service.http.app import PlatformDep

router = APIRouter(prefix="/v1/deployments/{deployment_id}", tags=["deployments"])

VersionPath = Annotated[int, Path(ge=1, le=MAX_VERSION, description="A version number")]
LabelPath = Annotated[str, Path(min_length=1, max_length=64, description=LABEL_RULE)]


@router.post(
    "/versions",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=VersionOut,
    responses={
        404: {"description": "No such deployment or training of the caller's"},
        409: {
            "description": "The deployment is not READY, loads as many versions as it may, "
            f"or the training is not COMPLETED. {DEPLOYMENT_RULE}"
        },
        422: {"description": f"The training holds no TensorFlow SavedModel. {DEPLOYMENT_RULE}"},
    },
)
def add_version(
    deployment_id: str,
    body: VersionCreate,
    tenant: CurrentTenant,
    platform: PlatformDep,
    session: SessionDep,
    request: Request,
    response: Response,
) -> VersionOut:
    """Add the deployment's next version from a training's SavedModel: 202 DEPLOYING, then
    READY once its model process loaded it (no restart; requests in flight keep their
    version), or FAILED with the reason (it never becomes the default)."""
    deployment = service.owned_deployment(session, tenant, deployment_id)
    training = owned_training(session, tenant, body.training_id)
    version = service.add_version(session, platform.store, platform.catalog, deployment, training)
    session.commit()
    wake_scoring(request)
    response.headers["Location"] = f"/v1/deployments/{deployment_id}/versions/{version.version}"
    return VersionOut.of(version, {})


@router.get("/versions", response_model=VersionList)
def list_versions(deployment_id: str, tenant: CurrentTenant, session: SessionDep) -> VersionList:
    """The deployment's versions, its labels and the version a request gets by default."""
    deployment = service.owned_deployment(session, tenant, deployment_id)
    versions, labels = service.version_view(session, deployment.id)
    return VersionList.of(versions, labels)


@router.delete(
    "/versions/{version}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={
        404: {"description": "No such version"},
        409: {
            "description": "A label points at it, it is still DEPLOYING, or it is the only "
            "loaded version"
        },
    },
)
def unload_version(
    deployment_id: str,
    version: VersionPath,
    tenant: CurrentTenant,
    platform: PlatformDep,
    session: SessionDep,
    request: Request,
) -> Response:
    """Unload a version: its model process stops and requests for it are 404."""
    deployment = service.owned_deployment(session, tenant, deployment_id)
    changed = service.unload_version(session, platform.store, deployment, version)
    session.commit()
    if changed:
        wake_scoring(request, deployment_id, version=version)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put(
    "/labels/{label}",
    response_model=LabelOut,
    responses={
        409: {"description": "The version is not loaded (READY)"},
        422: {"description": "No such version, or not a label name"},
    },
)
def set_label(
    deployment_id: str,
    label: LabelPath,
    body: LabelSet,
    tenant: CurrentTenant,
    session: SessionDep,
    request: Request,
) -> LabelOut:
    """Point the label at a loaded version (created, or moved at once: requests that
    name it get that version from now on)."""
    deployment = service.owned_deployment(session, tenant, deployment_id)
    service.set_label(session, deployment, label, body.version)
    session.commit()
    wake_scoring(request, deployment_id, forget=False)
    return LabelOut(label=label, version=body.version)


@router.delete(
    "/labels/{label}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={404: {"description": "No such label"}},
)
def delete_label(
    deployment_id: str,
    label: LabelPath,
    tenant: CurrentTenant,
    session: SessionDep,
    request: Request,
) -> Response:
    """Remove the label (requests that name it are 404 after)."""
    deployment = service.owned_deployment(session, tenant, deployment_id)
    service.delete_label(session, deployment, label)
    session.commit()
    wake_scoring(request, deployment_id, forget=False)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
