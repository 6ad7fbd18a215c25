"""Trainings: submit, list, read, stop, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Query, Request, Response, UploadFile, status
from sqlalchemy import Connection

from service import submissions
from service import trainings as service
from service.api.deps import CurrentTenant, LoopReads, SessionDep, current_tenant, owned_training
from service.api.schemas import TrainingList, TrainingOut
from service.api.training_views import TrainingViews
from service.db import repository
from service.domain.manifest import MAX_MANIFEST_BYTES
from service.domain.states import TrainingState
from service.errors import BadRequest, FieldError, NotFound, ServiceUnavailable
from service.http.app import PlatformDep
from service.platform import Platform
from service.storage.base import StoreUnavailable

router = APIRouter(prefix="/v1/trainings", tags=["trainings"])

ManifestFile = Annotated[
    UploadFile, File(description="The training manifest, YAML or JSON (manifests/*.yaml).")
]
CodeArchive = Annotated[
    UploadFile, File(description="The training code as a .zip or .tar.gz archive.")
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TrainingOut,
    responses={413: {"description": "Upload above the size limit"}},
)
def create_training(
    manifest: ManifestFile,
    model_definition: CodeArchive,
    tenant: CurrentTenant,
    platform: PlatformDep,
) -> Response:
    """Validate the manifest against the catalog and the tenant's plan, check the code
    archive, store it, and queue the training."""
    manifest_text = manifest.file.read(MAX_MANIFEST_BYTES + 1)  # more is refused: too large
    # The session is this thread's own, not a dependency's: FastAPI enters and leaves a
    # generator dependency in worker threads of its own, two more hops a submission.
    with (
        platform.sessions() as session,
        submissions.submission(
            session, platform, tenant, manifest_text, model_definition.file
        ) as training,
    ):
        session.commit()
    # The body made once, by the model's own serialiser (returning the model had FastAPI
    # validate it again against the response model before serialising it).
    return Response(
        TrainingOut.of(training).model_dump_json(),
        status_code=status.HTTP_201_CREATED,
        media_type="application/json",
        headers={"Location": f"/v1/trainings/{training.id}"},
    )


@router.get("", response_model=TrainingList)
async def list_trainings(
    request: Request,
    tenant: CurrentTenant,
    status: Annotated[TrainingState | None, Query(description="Only this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> Response:
    """The tenant's trainings, newest first."""
    reads: LoopReads = request.app.state.reads
    try:
        views, next_cursor = await reads(
            repository.list_training_views, tenant.id, status=status, limit=limit, cursor=cursor
        )
    except ValueError as e:
        raise BadRequest(
            "cursor is not one this service returned", errors=[FieldError("cursor", str(e))]
        ) from e
    page = TrainingList(items=[TrainingOut.of(v) for v in views], next_cursor=next_cursor)
    return Response(page.model_dump_json(), media_type="application/json")


@router.get("/{training_id}", response_model=TrainingOut)
async def get_training(training_id: str, request: Request) -> Response:
    """The training, its learners and its status history."""
    # What every client following a training polls: no FastAPI dependencies to solve,
    # on PostgreSQL the body kept while it is current (training_views), else three
    # prepared queries, no ORM objects, no worker thread (see deps.LoopReads).
    platform: Platform = request.app.state.platform
    tenant = await current_tenant(request, platform)
    views: TrainingViews | None = request.app.state.training_views
    if views is not None and (body := views.get(tenant.id, training_id)) is not None:
        return Response(body, media_type="application/json")
    mark = views.mark() if views is not None else 0
    reads: LoopReads = request.app.state.reads
    body = await reads(_training_json, tenant.id, training_id)
    if views is not None:
        views.put(tenant.id, training_id, body, mark)
    return Response(body, media_type="application/json")


def _training_json(conn: Connection, tenant_id: str, training_id: str) -> bytes:
    view = repository.training_view(conn, tenant_id, training_id)
    if view is None:
        raise NotFound(f"training {training_id} not found")
    return TrainingOut.of(view).model_dump_json().encode()


@router.post(
    "/{training_id}/stop",
    response_model=TrainingOut,
    responses={
        202: {
            "model": TrainingOut,
            "description": "Stop requested; the learners are being stopped",
        },
        409: {"description": "The training already ended (COMPLETED or FAILED)"},
    },
)
def stop_training(
    training_id: str,
    tenant: CurrentTenant,
    platform: PlatformDep,
    session: SessionDep,
    response: Response,
) -> TrainingOut:
    """Stop the training: HALTED at once if no learner started, else 202 until it is."""
    training = owned_training(session, tenant, training_id)
    halted = service.request_stop(training)
    session.commit()
    platform.wake_monitor()
    if not halted:
        response.status_code = status.HTTP_202_ACCEPTED
    return TrainingOut.of(training)


@router.delete(
    "/{training_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={
        202: {
            "model": TrainingOut,
            "description": "Learners are being stopped; deleted once they are",
        }
    },
)
def delete_training(
    training_id: str, tenant: CurrentTenant, platform: PlatformDep, session: SessionDep
) -> Response:
    """Delete the training and everything stored for it, stopping it first if running."""
    training = owned_training(session, tenant, training_id)
    try:
        deleted = service.delete_training(session, platform.store, platform.logs, training)
    except StoreUnavailable as e:
        raise ServiceUnavailable(f"the training's files cannot be deleted: {e}") from e
    session.commit()
    if deleted:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return Response(
        TrainingOut.of(training).model_dump_json(),
        status_code=status.HTTP_202_ACCEPTED,
        media_type="application/json",
    )
