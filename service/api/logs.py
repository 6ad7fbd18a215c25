"""A training's logs (text, optionally followed live) and the metrics read from them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from service.api.deps import CurrentTenant, SessionDep, owned_training
from service.db import repository
from service.domain.manifest import metric_pattern
from service.domain.states import TrainingState
from service.errors import BadRequest, Conflict, FieldError
from service.http.app import PlatformDep
from service.logs import all_records, extract_metrics
from service.platform import Platform

router = APIRouter(prefix="/v1/trainings", tags=["trainings"])

# How often a follower re-reads the training's state while no line arrives.
_STATE_CHECK = 0.5


def _parse_since(since: str | None) -> float | None:
    if since is None:
        return None
    try:
        return float(since)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError as e:
        message = "must be an ISO 8601 time or seconds since the epoch"
        raise BadRequest(f"since {message}", errors=[FieldError("since", message)]) from e
    return stamp.timestamp()


def _ended(platform: Platform, training_id: str) -> bool:
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        return training is None or TrainingState(training.status).terminal


def follow_lines(
    platform: Platform,
    training_id: str,
    *,
    learner: int | None,
    since: float | None,
    follow: bool,
) -> Iterator[str]:
    """Rendered log lines; with `follow`, until the training is terminal and drained."""
    cursor: str | None = None
    ended = not follow or _ended(platform, training_id)
    checked = time.monotonic()
    while True:
        records, cursor = platform.logs.read(training_id, cursor)
        for record in records:
            if learner is not None and record.learner != learner:
                continue
            if since is not None and record.ts < since:
                continue
            yield record.render() + "\n"
        if records:
            continue
        if ended:
            return
        platform.logs.wait(training_id, cursor, _STATE_CHECK)
        if time.monotonic() - checked >= _STATE_CHECK:
            # Learners append every line before they report their end, so once the
            # training is terminal one more read drains the log.
            ended = _ended(platform, training_id)
            checked = time.monotonic()


@router.get(
    "/{training_id}/logs",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/plain": {}}, "description": "One line per log line"}},
)
def get_training_logs(
    training_id: str,
    tenant: CurrentTenant,
    session: SessionDep,
    platform: PlatformDep,
    learner: Annotated[int | None, Query(ge=1, description="Only this learner's lines.")] = None,
    since: Annotated[str | None, Query(description="ISO 8601 time or epoch seconds.")] = None,
    follow: Annotated[bool, Query(description="Stream until the training ends.")] = False,
) -> StreamingResponse:
    """Every learner's stdout and stderr, `<time> [learner <i>] <line>` per line."""
    training = owned_training(session, tenant, training_id)
    since_ts = _parse_since(since)
    lines = follow_lines(platform, training.id, learner=learner, since=since_ts, follow=follow)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8")


@router.get("/{training_id}/metrics")
def get_training_metrics(
    training_id: str, tenant: CurrentTenant, session: SessionDep, platform: PlatformDep
) -> dict[str, list[dict[str, Any]]]:
    """`{"<metric>": [{"value", "learner", "timestamp", "step"}...]}` from the manifest's
    evaluation_metrics regexes applied to every log line."""
    training = owned_training(session, tenant, training_id)
    metrics = [(m["name"], m["regex"]) for m in training.manifest.get("evaluation_metrics", [])]
    # A training submitted before metric regexes ran on RE2 may keep one RE2 refuses.
    errors = []
    for i, (_name, regex) in enumerate(metrics):
        try:
            metric_pattern(regex)
        except ValueError as e:
            errors.append(FieldError(f"/evaluation_metrics/{i}/regex", str(e)))
    if errors:
        raise Conflict(
            "the training's manifest has metric regexes this service cannot run",
            errors=errors,
        )
    records = all_records(platform.logs, training.id)
    return {
        name: [dict(p) for p in points]
        for name, points in extract_metrics(records, metrics).items()
    }
