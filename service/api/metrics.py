"""A training's metrics: the documents its learners stored (one bounded object read per
learner), never its log.

Each learner's wrapper finds the points as its output is written (the manifest's
`evaluation_metrics` regexes, `keys.log_metrics_key`) or reads them from its TensorBoard
event files (`{type: tensorboard}`, `keys.tensorboard_metrics_key`), and stores them as one
JSON document of at most MAX_TENSORBOARD_POINTS points; so a call costs the same on a log of
two million lines as on one of a thousand. A learner that has stored none yet (or ran
before the wrappers stored them) has none: the answer is capped, never paged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import LoopReads, current_tenant
from service.db import repository
from service.domain.manifest import log_metric_definitions, tensorboard_metrics
from service.domain.metrics import (
    MAX_TENSORBOARD_DOCUMENT_BYTES,
    LogMetricPoint,
    TensorBoardPoint,
    metric_pattern,
    parse_log_metrics_document,
    parse_tensorboard_document,
)
from service.errors import Conflict, FieldError, NotFound, ServiceUnavailable
from service.logs.base import iso_utc
from service.platform import Platform
from service.storage import keys
from service.storage.base import ObjectNotFound, ObjectStore, StoreUnavailable

router = APIRouter(prefix="/v1/trainings", tags=["trainings"])

Point = TensorBoardPoint | LogMetricPoint


MetricsAnswer = dict[str, list[dict[str, Any]]]


@router.get(
    "/{training_id}/metrics",
    response_model=MetricsAnswer,
    responses={
        409: {
            "description": "The manifest has a metric regex this service cannot run, or a "
            "learner's stored metrics cannot be read"
        },
        503: {"description": "The object store cannot be read"},
    },
)
async def get_training_metrics(training_id: str, request: Request) -> Response:
    """`{"<metric>": [{"value", "learner", "timestamp", "step"}...]}`: what the manifest's
    evaluation_metrics regexes found in the learners' output so far (every metric named,
    `[]` until it matches), or for `evaluation_metrics: {type: tensorboard}` the scalars of
    their TensorBoard event files under LOG_DIR (`<run>/<tag>` each); every learner's
    points merged in time order. At most 50,000 points per learner; the log is not read."""
    # What a dashboard polls, and a flood of it must cost other tenants little: no FastAPI
    # dependencies, no ORM objects, the database read without a worker thread
    # (deps.LoopReads); only the object store's reads go to one.
    platform: Platform = request.app.state.platform
    tenant = await current_tenant(request, platform)
    reads: LoopReads = request.app.state.reads
    found = await reads(repository.training_manifest_and_learners, tenant.id, training_id)
    if found is None:
        raise NotFound(f"training {training_id} not found")
    manifest, learners = found
    body = await run_in_threadpool(_answer, platform.store, training_id, learners, manifest)
    return Response(body, media_type="application/json")


def _answer(
    store: ObjectStore, training_id: str, learners: list[int], manifest: dict[str, Any]
) -> bytes:
    """The answer's JSON, in a worker thread: the documents are read from the object store
    (a network call on S3) and may hold 50,000 points each."""
    if tensorboard_metrics(manifest):
        answer = read_tensorboard_metrics(store, training_id, learners)
    else:
        metrics = log_metric_definitions(manifest)
        errors = [
            FieldError(f"/evaluation_metrics/{i}/regex", refused)
            for i, (_name, regex) in enumerate(metrics)
            if (refused := _refusal(regex)) is not None
        ]
        if errors:
            # A training submitted before metric regexes ran on RE2 may keep one.
            raise Conflict(
                "the training's manifest has metric regexes this service cannot run",
                errors=errors,
            )
        answer = read_log_metrics(store, training_id, learners, [name for name, _ in metrics])
    return orjson.dumps(answer)


@functools.lru_cache(maxsize=4096)
def _refusal(regex: str) -> str | None:
    """Why RE2 refuses the regex, or None; kept, as a dashboard asks again and again."""
    try:
        metric_pattern(regex)
    except ValueError as e:
        return str(e)
    return None


def read_log_metrics(
    store: ObjectStore, training_id: str, learners: list[int], names: Sequence[str]
) -> MetricsAnswer:
    """Every learner's stored log metrics (keys.log_metrics_key), merged per metric in time
    order; every one of `names` is in the answer. A learner that has stored none (none
    found yet, or it ran before learners stored them) has none."""
    found = _merged(
        _documents(store, training_id, learners, keys.log_metrics_key, parse_log_metrics_document),
        "log",
    )
    return {name: found.get(name, []) for name in names}


def read_tensorboard_metrics(
    store: ObjectStore, training_id: str, learners: list[int]
) -> dict[str, list[dict[str, Any]]]:
    """Every learner's stored TensorBoard scalars (service.domain.metrics' document), merged
    per metric in time order; a learner that has stored none yet has none."""
    documents = _documents(
        store, training_id, learners, keys.tensorboard_metrics_key, parse_tensorboard_document
    )
    return _merged(documents, "TensorBoard")


Parse = Callable[[bytes], "dict[str, list[TensorBoardPoint]] | dict[str, list[LogMetricPoint]]"]


def _documents(
    store: ObjectStore,
    training_id: str,
    learners: list[int],
    key_of: Callable[[str, int], str],
    parse: Parse,
) -> Iterator[tuple[int, dict[str, Sequence[Point]] | ValueError]]:
    """Each learner's document, parsed (or the ValueError saying why it is not one): at
    most MAX_TENSORBOARD_DOCUMENT_BYTES read of each; learners without one are left out."""
    for learner in learners:
        try:
            with store.open(key_of(training_id, learner)) as reader:
                data = reader.read(MAX_TENSORBOARD_DOCUMENT_BYTES + 1)
        except ObjectNotFound:
            continue
        except StoreUnavailable as e:
            raise ServiceUnavailable(f"the object store cannot be read: {e}") from e
        try:
            yield learner, dict(parse(data))
        except ValueError as e:
            yield learner, e


def _merged(
    documents: Iterator[tuple[int, dict[str, Sequence[Point]] | ValueError]], what: str
) -> dict[str, list[dict[str, Any]]]:
    merged: dict[str, list[tuple[float, int, Point]]] = {}
    errors = []
    for learner, document in documents:
        if isinstance(document, ValueError):
            errors.append(FieldError(f"learner-{learner}", f"the stored metrics {document}"))
            continue
        for name, points in document.items():
            merged.setdefault(name, []).extend((p.wall_time, learner, p) for p in points)
    if errors:
        raise Conflict(f"the stored {what} metrics cannot be read", errors=errors)
    return {
        name: [
            {
                "value": point.value,
                "learner": learner,
                "timestamp": iso_utc(point.wall_time),
                "step": point.step,
            }
            for _, learner, point in sorted(points, key=lambda p: (p[0], p[1]))
        ]
        for name, points in sorted(merged.items())
    }
