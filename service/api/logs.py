"""A training's logs: text, a page at a time or followed live.

No request holds a worker thread while it waits: a page is read in one short trip to a
worker thread; a followed log is an async stream that reads the log store one batch at a
time in a worker thread and sleeps on the event loop between reads. Followed streams are
counted per tenant (`LogFollowers`), so no tenant can tie up the API with them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from service.api.deps import CurrentTenant, LoopReads
from service.db import repository
from service.domain.states import TrainingState
from service.errors import (
    BadRequest,
    FieldError,
    NotFound,
    TooManyRequests,
)
from service.http.app import PlatformDep
from service.logs import (
    READ_BATCH,
    LogRecord,
    read_page,
    render_lines,
)
from service.platform import Platform

router = APIRouter(prefix="/v1/trainings", tags=["trainings"])

TEXT = "text/plain; charset=utf-8"
# Most bytes of log lines in one response without `follow` (X-Next-Cursor for the rest).
PAGE_BYTES = 1024 * 1024
# Most records one page looks at, kept or not (with `learner` or `since`, many may not be).
PAGE_RECORDS = 100_000
NEXT_CURSOR = "X-Next-Cursor"
# A follower's pause between two reads while no line comes: short after a line, longer
# while the log is quiet.
_PAUSE_MIN = 0.05
_PAUSE_MAX = 0.1
# How often a quiet follower re-reads the training's state.
_STATE_CHECK = 1.0
# What a refused follower is told to wait before it asks again.
_FOLLOW_RETRY_AFTER = 5


class LogFollowers:
    """The followed log streams open in this API process, per tenant, at most `limit`
    each (`DLAAS_MAX_LOG_FOLLOWERS_PER_TENANT`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def open(self, tenant_id: str) -> int:
        """How many streams the tenant has open."""
        return self._open.get(tenant_id, 0)

    def acquire(self, tenant_id: str) -> Callable[[], None]:
        """Count one more stream of the tenant's, or raise TooManyRequests at the limit.
        Returns the function that gives it back (once, however often it is called)."""
        with self._lock:
            used = self._open.get(tenant_id, 0)
            if used >= self.limit:
                raise TooManyRequests(
                    f"this tenant may follow at most {self.limit} logs at once "
                    f"(DLAAS_MAX_LOG_FOLLOWERS_PER_TENANT) and has {used} open; close one, "
                    "or read without follow",
                    retry_after=_FOLLOW_RETRY_AFTER,
                )
            self._open[tenant_id] = used + 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                left = self._open[tenant_id] - 1
                if left:
                    self._open[tenant_id] = left
                else:
                    del self._open[tenant_id]

        return release


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


def _bad_cursor(e: ValueError) -> BadRequest:
    return BadRequest(
        f"cursor is not one this service returned ({NEXT_CURSOR})",
        errors=[FieldError("cursor", str(e))],
    )


def _filter(learner: int | None, since: float | None) -> Callable[[LogRecord], bool] | None:
    """What keeps a record, or None to keep every one."""
    if learner is None and since is None:
        return None

    def keep(record: LogRecord) -> bool:
        if learner is not None and record.learner != learner:
            return False
        return since is None or record.ts >= since

    return keep


def _terminal(status: str | None) -> bool:
    """A training that is gone counts as ended."""
    return status is None or TrainingState(status).terminal


async def follow_lines(
    platform: Platform,
    reads: LoopReads,
    request: Request,
    tenant_id: str,
    training_id: str,
    *,
    keep: Callable[[LogRecord], bool] | None,
    cursor: str | None,
    ended: bool,
) -> AsyncIterator[bytes]:
    """Rendered log lines from `cursor` until the training is terminal and its log drained,
    or the client goes away. Each store read runs in a worker thread and returns; waits are
    on the event loop, so a follower holds no thread."""
    checked = time.monotonic()
    pause = _PAUSE_MIN
    while True:
        records, cursor = await run_in_threadpool(
            platform.logs.read, training_id, cursor, READ_BATCH
        )
        text = render_lines(records, keep)
        if text:
            yield text
        if records:
            pause = _PAUSE_MIN
            continue
        if ended:
            # Learners append every line before they report their end, so the read after
            # the training was seen terminal drained the log.
            return
        if await request.is_disconnected():
            return
        await anyio.sleep(pause)
        pause = min(pause * 2, _PAUSE_MAX)
        if time.monotonic() - checked >= _STATE_CHECK:
            ended = _terminal(await reads(repository.training_status, tenant_id, training_id))
            checked = time.monotonic()


class FollowedLog(StreamingResponse):
    """A followed log's response: gives its follower's place back however the stream ends
    (the training ended, the client went away, an error)."""

    def __init__(self, lines: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(lines, media_type=TEXT)
        self._lines = lines
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
            aclose = getattr(self._lines, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


@router.get(
    "/{training_id}/logs",
    responses={
        200: {
            "content": {"text/plain": {}},
            "description": "One line per log line. Without follow, at most 1 MiB of lines: "
            f"when more remain, the {NEXT_CURSOR} header is the cursor of the next page.",
            "headers": {NEXT_CURSOR: {"description": "Where the next page starts, if any."}},
        },
        429: {"description": "The tenant follows as many logs as it may; see Retry-After"},
    },
)
async def get_training_logs(
    training_id: str,
    request: Request,
    tenant: CurrentTenant,
    platform: PlatformDep,
    learner: Annotated[int | None, Query(ge=1, description="Only this learner's lines.")] = None,
    since: Annotated[str | None, Query(description="ISO 8601 time or epoch seconds.")] = None,
    follow: Annotated[bool, Query(description="Stream until the training ends.")] = False,
    cursor: Annotated[
        str | None, Query(description=f"Start after this point: the {NEXT_CURSOR} of a page.")
    ] = None,
) -> Response:
    """Every learner's stdout and stderr, `<time> [learner <i>] <line>` per line. A page at
    a time (up to 1 MiB; `X-Next-Cursor` names the next), or with `follow` one stream until
    the training ends (at most DLAAS_MAX_LOG_FOLLOWERS_PER_TENANT at once per tenant)."""
    reads: LoopReads = request.app.state.reads
    status = await reads(repository.training_status, tenant.id, training_id)
    if status is None:
        raise NotFound(f"training {training_id} not found")
    keep = _filter(learner, _parse_since(since))
    if not follow:
        try:
            page = await run_in_threadpool(
                read_page,
                platform.logs,
                training_id,
                cursor,
                keep=keep,
                max_bytes=PAGE_BYTES,
                max_records=PAGE_RECORDS,
            )
        except ValueError as e:
            raise _bad_cursor(e) from e
        headers = {NEXT_CURSOR: page.cursor} if page.more else None
        return Response(page.text, media_type=TEXT, headers=headers)
    if cursor:
        try:  # an invalid cursor is a 400 now, not a broken stream later
            await run_in_threadpool(platform.logs.read, training_id, cursor, 0)
        except ValueError as e:
            raise _bad_cursor(e) from e
    followers: LogFollowers = request.app.state.log_followers
    release = followers.acquire(tenant.id)
    lines = follow_lines(
        platform,
        reads,
        request,
        tenant.id,
        training_id,
        keep=keep,
        cursor=cursor,
        ended=_terminal(status),
    )
    return FollowedLog(lines, release)
