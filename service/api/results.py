"""A training's files: its results (listed, one by one with Range requests, or all as a
.tar.gz) and the code archive it was submitted with.

Results are whatever the learners stored under `trainings/<id>/results/` in the platform's
object store: RESULT_DIR's files, `learner-<i>/training-log.txt` and `learner-<i>/logs/...`
(LOG_DIR). They outlive the learners and the worker; deleting the training removes them.
"""

from __future__ import annotations

import itertools
import mimetypes
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Annotated, Any, BinaryIO
from urllib.parse import quote

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from service.api.deps import CurrentTenant, SessionDep, owned_training
from service.errors import BadRequest, DlaasError, FieldError, NotFound, ServiceUnavailable
from service.http.app import PlatformDep
from service.storage import keys
from service.storage.base import ObjectInfo, ObjectNotFound, ObjectStore, StoreUnavailable

router = APIRouter(prefix="/v1/trainings", tags=["results"])

_CHUNK = 1024 * 1024
# A result file is served with the type its name suggests (octet-stream when none does).
_RESULT_FILE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"*/*": {}}, "description": "The file, typed by its name"}
}
_CODE_ARCHIVE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/zip": {}, "application/gzip": {}},
        "description": "The archive as uploaded: .zip or .tar.gz",
    }
}


class RangeNotSatisfiable(DlaasError):
    status = 416
    title = "Range not satisfiable"
    slug = "range-not-satisfiable"

    def __init__(self, size: int) -> None:
        super().__init__(
            f"the requested range is outside the file ({size} bytes)",
            errors=[FieldError("Range", f"must start before byte {size}")],
        )
        self.headers["Content-Range"] = f"bytes */{size}"


class ResultFile(BaseModel):
    path: str
    size: int
    last_modified: datetime


class ResultFiles(BaseModel):
    files: list[ResultFile]
    next_cursor: str | None = Field(
        default=None,
        description="More files follow: pass this as `cursor` for the next page (null: the "
        "last page).",
    )


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of a single `bytes=a-b`, `bytes=a-` or `bytes=-n` Range header for an
    object of `size` bytes; None to send all of it (no header, or one this server ignores
    as RFC 9110 allows: another unit, several ranges, bad syntax). RangeNotSatisfiable if
    the range starts past the end."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or "," in spec or not dash:
        return None
    first, last = first.strip(), last.strip()
    if not (first.isdigit() or not first) or not (last.isdigit() or not last):
        return None
    if not first:  # the last n bytes
        if not last:
            return None
        n = int(last)
        if n == 0 or size == 0:
            raise RangeNotSatisfiable(size)
        return max(0, size - n), size
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise RangeNotSatisfiable(size)
    return start, size if not last else min(int(last) + 1, size)


def _result_key(training_id: str, path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        message = "must be a relative file path without '.', '..' or empty segments"
        raise BadRequest(f"path {message}", errors=[FieldError("path", message)])
    if "\0" in path or "\\" in path:
        message = "must not contain NUL or backslash characters"
        raise BadRequest(f"path {message}", errors=[FieldError("path", message)])
    return keys.result_key(training_id, path)


def _disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name)}"


def _stream(reader: BinaryIO) -> Iterator[bytes]:
    with reader:
        while chunk := reader.read(_CHUNK):
            yield chunk


def _unavailable(e: StoreUnavailable) -> ServiceUnavailable:
    return ServiceUnavailable(f"the object store cannot be read: {e}")


def _list(store: ObjectStore, prefix: str) -> Iterator[ObjectInfo]:
    """The objects below `prefix`, listed as they are taken; a store that cannot be read is
    a 503 now (its first object is listed here), not a broken stream later."""
    try:
        listing = iter(store.list(prefix))
        first = next(listing, None)
    except StoreUnavailable as e:
        raise _unavailable(e) from e
    return itertools.chain([first] if first is not None else [], listing)


# Most files one page of GET .../results lists (S3's own page size).
MAX_RESULTS_PAGE = 1000


@router.get("/{training_id}/results", response_model=ResultFiles)
def list_training_results(
    training_id: str,
    tenant: CurrentTenant,
    session: SessionDep,
    platform: PlatformDep,
    limit: Annotated[
        int, Query(ge=1, le=MAX_RESULTS_PAGE, description="Most files in this page.")
    ] = MAX_RESULTS_PAGE,
    cursor: Annotated[
        str | None,
        Query(max_length=1024, description="The next_cursor of the previous page."),
    ] = None,
) -> ResultFiles:
    """The stored result files, a page at a time in path order (at most `limit`, 1000):
    RESULT_DIR's, and each learner's `training-log.txt` and LOG_DIR under `learner-<i>/`.
    A page costs what it lists, however many files the training stored."""
    training = owned_training(session, tenant, training_id)
    prefix = keys.results_prefix(training.id)
    try:
        found = list(
            itertools.islice(platform.store.list(prefix, prefix + (cursor or "")), limit + 1)
        )
    except StoreUnavailable as e:
        raise _unavailable(e) from e
    page = found[:limit]
    files = [
        ResultFile(path=i.key[len(prefix) :], size=i.size, last_modified=i.last_modified)
        for i in page
    ]
    return ResultFiles(files=files, next_cursor=files[-1].path if len(found) > limit else None)


@router.get(
    "/{training_id}/results.tar.gz",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/gzip": {}}}},
)
def download_training_results(
    training_id: str, tenant: CurrentTenant, session: SessionDep, platform: PlatformDep
) -> StreamingResponse:
    """All result files as one gzip'd tar, streamed, under `training-<id>/` (listed as it
    is sent: the listing is never held whole)."""
    training = owned_training(session, tenant, training_id)
    prefix = keys.results_prefix(training.id)
    files = _list(platform.store, prefix)
    name = keys.training_folder(training.id)
    return StreamingResponse(
        tar_gz(platform.store, files, prefix, name),
        media_type="application/gzip",
        headers={"Content-Disposition": _disposition(f"{name}-results.tar.gz")},
    )


def tar_gz(
    store: ObjectStore, files: Iterable[ObjectInfo], prefix: str, root: str
) -> Iterator[bytes]:
    """A .tar.gz of the objects, produced as it is sent: one chunk of an object in memory
    at a time. Objects deleted meanwhile are left out; one that shrank is padded."""
    gzip = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: the gzip format
    for info in files:
        try:
            reader = store.open(info.key)
        except ObjectNotFound:
            continue
        with reader:
            entry = tarfile.TarInfo(f"{root}/{info.key[len(prefix) :]}")
            entry.size = info.size
            entry.mtime = int(info.last_modified.timestamp())
            entry.mode = 0o644
            if out := gzip.compress(entry.tobuf(tarfile.PAX_FORMAT, "utf-8")):
                yield out
            remaining = info.size
            while remaining > 0:
                chunk = reader.read(min(_CHUNK, remaining)) or b"\0" * min(_CHUNK, remaining)
                remaining -= len(chunk)
                if out := gzip.compress(chunk):
                    yield out
        if out := gzip.compress(b"\0" * (-info.size % tarfile.BLOCKSIZE)):
            yield out
    yield gzip.compress(b"\0" * 2 * tarfile.BLOCKSIZE) + gzip.flush()


@router.get(
    "/{training_id}/results/{path:path}",
    response_class=StreamingResponse,
    responses={
        **_RESULT_FILE,
        206: {"content": {"*/*": {}}, "description": "The requested byte range"},
        416: {"description": "The range starts past the end of the file"},
    },
)
def get_training_result(
    training_id: str,
    path: str,
    tenant: CurrentTenant,
    session: SessionDep,
    platform: PlatformDep,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> StreamingResponse:
    """One result file, streamed; `Range: bytes=a-b`, `bytes=a-` and `bytes=-n` get 206."""
    training = owned_training(session, tenant, training_id)
    key = _result_key(training.id, path)
    try:
        info = platform.store.stat(key)
        if info is None:
            raise NotFound(f"training {training.id} has no result file {path!r}")
        window = byte_range(range_header, info.size)
        start, end = window or (0, info.size)
        reader = platform.store.open_range(key, start, end) if window else platform.store.open(key)
    except ObjectNotFound as e:
        raise NotFound(f"training {training.id} has no result file {path!r}") from e
    except StoreUnavailable as e:
        raise _unavailable(e) from e
    headers = {
        "Accept-Ranges": "bytes",
        "Content-Length": str(end - start),
        "Content-Disposition": _disposition(path.rsplit("/", 1)[-1]),
        "Last-Modified": info.last_modified.strftime("%a, %d %b %Y %H:%M:%S GMT"),
    }
    if window:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{info.size}"
    media_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return StreamingResponse(
        _stream(reader), status_code=206 if window else 200, media_type=media_type, headers=headers
    )


@router.get(
    "/{training_id}/model_definition", response_class=StreamingResponse, responses=_CODE_ARCHIVE
)
def get_model_definition(
    training_id: str, tenant: CurrentTenant, session: SessionDep, platform: PlatformDep
) -> StreamingResponse:
    """The code archive the training was submitted with (.zip or .tar.gz)."""
    training = owned_training(session, tenant, training_id)
    key = training.model_definition_key
    name = key.rsplit("/", 1)[-1]
    try:
        info = platform.store.stat(key)
        reader = platform.store.open(key)
    except ObjectNotFound as e:
        raise NotFound(f"the code archive of training {training.id} is gone") from e
    except StoreUnavailable as e:
        raise _unavailable(e) from e
    headers = {"Content-Disposition": _disposition(name)}
    if info is not None:
        headers["Content-Length"] = str(info.size)
    media_type = "application/zip" if name.endswith(".zip") else "application/gzip"
    return StreamingResponse(_stream(reader), media_type=media_type, headers=headers)
