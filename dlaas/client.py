"""The DLaaS Python client: trainings, deployments and tenants over the REST API.

    from dlaas import Client

    client = Client()  # DLAAS_URL / DLAAS_API_KEY, else the config `dlaas up` wrote
    training = client.trainings.create("manifests/06-quickstart.yaml", "examples/quickstart")
    for line in client.trainings.logs(training.id, follow=True):
        print(line)
    done = client.trainings.wait(training.id)
    deployment = client.deployments.wait(client.deployments.create(done.id).id)
    print(client.deployments.predict(deployment.id, [[1.0, 2.0]]))

It is synchronous (httpx) and needs none of the server's dependencies. Every method raises
a `dlaas.errors.DlaasError`: an `ApiError` subclass for what the API refused (mapped from
its problem+json: `NotFound`, `ValidationError` with the offending fields, ...), or
`ConnectionFailed` when the API could not be reached.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self
from urllib.parse import quote

import httpx

from dlaas import __version__
from dlaas.config import DEFAULT_URL, load_config
from dlaas.deployments import Deployments
from dlaas.errors import (
    ApiError,
    ConnectionFailed,
    DlaasError,
    Unauthorized,
    WaitTimeout,
    error_from_response,
)
from dlaas.models import (
    ApiKey,
    MetricPoint,
    Page,
    ResultFile,
    Tenant,
    Training,
    Usage,
)

ProgressCallback = Callable[[int, int | None], None]
# The header of a log page that says where the next one starts.
NEXT_CURSOR = "X-Next-Cursor"
"""Called with (bytes done, bytes in all or None if unknown) as an upload or download runs."""

ManifestSource = str | os.PathLike[str] | Mapping[str, Any]
CodeSource = str | os.PathLike[str] | bytes

_CHUNK = 64 * 1024
_SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".mypy_cache", ".pytest_cache"})


class _ClosedOnExit:
    """A context manager that `close()`s what it is on leaving the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Client(_ClosedOnExit):
    """A connection to one DLaaS API as one tenant (or as the admin, for `tenants`).

    `url` and `api_key` default to `DLAAS_URL` and `DLAAS_API_KEY`, then to the client
    configuration `dlaas up` writes (`$DLAAS_HOME/client.json`, see dlaas.config), then to
    http://127.0.0.1:8080 with no key. `transport` replaces httpx's network transport (tests
    pass one that calls the ASGI app directly). Use it as a context manager, or `close()` it.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        config = load_config()
        self.url = (
            url or os.environ.get("DLAAS_URL") or (config.url if config else None) or DEFAULT_URL
        ).rstrip("/")
        # The configured key belongs to the configured API: never send it anywhere else.
        configured_key = config.api_key if config and config.url.rstrip("/") == self.url else None
        self.api_key = api_key or os.environ.get("DLAAS_API_KEY") or configured_key
        self.timeout = timeout
        headers = {"User-Agent": f"dlaas-client/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )
        self.trainings = Trainings(self)
        self.deployments = Deployments(self)
        self.tenants = Tenants(self)

    def __repr__(self) -> str:
        return f"Client(url={self.url!r})"

    def close(self) -> None:
        """Close the connections to the API."""
        self._http.close()

    def healthy(self) -> bool:
        """Whether the API answers its liveness check (`GET /healthz`); never raises."""
        try:
            return self._http.get("/healthz", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def usage(self) -> Usage:
        """Your use against your plan's limits: `GET /v1/usage` (queued and active
        trainings, deployments, the max_runtime default and maximum)."""
        return Usage.from_json(self._json("GET", "/v1/usage"))

    # -- plumbing ------------------------------------------------------------------------

    def _connection_failed(self, e: httpx.HTTPError) -> ConnectionFailed:
        if isinstance(e, httpx.TimeoutException):
            return ConnectionFailed(f"the DLaaS API at {self.url} did not answer in time ({e})")
        return ConnectionFailed(
            f"cannot reach the DLaaS API at {self.url} ({e or type(e).__name__}); "
            "is `dlaas up` running, and is DLAAS_URL right?"
        )

    def _refused(self, response: httpx.Response) -> ApiError:
        error = error_from_response(response)
        if isinstance(error, Unauthorized) and not self.api_key:
            error.detail += (
                " (no API key configured: pass api_key, set DLAAS_API_KEY, or run `dlaas up`,"
                " which writes one for its local tenant)"
            )
            error.args = (f"{error.title} (HTTP 401): {error.detail}",)
            error.message = error.args[0]
        return error

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise self._connection_failed(e) from e
        if response.status_code >= 400:
            raise self._refused(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError as e:
            raise DlaasError(
                f"{method} {path}: {self.url} answered {response.status_code} with a body that "
                "is not JSON; is it a DLaaS API?"
            ) from e

    def _open_stream(
        self, method: str, path: str, *, timeout: httpx.Timeout | float | None = None, **kw: Any
    ) -> httpx.Response:
        """A response whose body is not read yet (the caller closes it), or the error."""
        request = self._http.build_request(
            method, path, timeout=self.timeout if timeout is None else timeout, **kw
        )
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as e:
            raise self._connection_failed(e) from e
        if response.status_code >= 400:
            try:
                response.read()
            except httpx.HTTPError as e:
                raise self._connection_failed(e) from e
            finally:
                response.close()
            raise self._refused(response)
        return response

    @contextmanager
    def _stream(self, method: str, path: str, **kw: Any) -> Iterator[httpx.Response]:
        response = self._open_stream(method, path, **kw)
        try:
            yield response
        finally:
            response.close()


class _ProgressReader:
    """A binary file that reports how much of it was read (httpx uploads it in chunks)."""

    def __init__(self, file: IO[bytes], total: int, progress: ProgressCallback) -> None:
        self._file = file
        self._total = total
        self._progress = progress
        self._done = 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        if chunk:
            self._done += len(chunk)
            self._progress(self._done, self._total)
        return chunk

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._file.seek(offset, whence)
        self._done = position
        return position

    def tell(self) -> int:
        return self._file.tell()

    def fileno(self) -> int:
        return self._file.fileno()


def _zip_directory(directory: Path, out: IO[bytes]) -> None:
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for root, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                file = Path(root) / name
                archive.write(file, file.relative_to(directory).as_posix())


def _manifest_part(manifest: ManifestSource) -> tuple[str, bytes]:
    if isinstance(manifest, Mapping):
        return "manifest.json", json.dumps(dict(manifest)).encode()
    path = Path(manifest)
    return path.name, path.read_bytes()


def _since(value: str | float | datetime | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _strip_top_directory(members: builtins.list[tarfile.TarInfo]) -> builtins.list[tarfile.TarInfo]:
    """The members without the one directory they all sit in (`training-<id>/`), if any."""
    tops = {m.name.split("/", 1)[0] for m in members}
    if len(tops) != 1 or not all("/" in m.name or m.isdir() for m in members):
        return members
    top = tops.pop() + "/"
    kept = []
    for m in members:
        if m.name.startswith(top):
            m.name = m.name[len(top) :]
            kept.append(m)
    return kept


class LogStream(_ClosedOnExit):
    """The lines of a training's log, as an iterator of str (no trailing newline).

    Each line is `<ISO time> [learner <i>] <text>`. A log read without follow comes in
    pages (the server sends at most 1 MiB at a time); the next page is asked for when one
    runs out, so the iterator yields every line. A followed stream ends when the training
    has ended and every line was delivered. Iterating raises `ConnectionFailed` if the
    connection breaks. Close it (or use it as a context manager) to stop early.
    """

    def __init__(
        self,
        client: Client,
        response: httpx.Response,
        next_page: Callable[[str], httpx.Response] | None = None,
    ) -> None:
        self._client = client
        self._response = response
        self._lines = response.iter_lines()
        self._next_page = next_page

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        while True:
            try:
                return next(self._lines)
            except StopIteration:
                cursor = self._response.headers.get(NEXT_CURSOR)
                self.close()
                if cursor is None or self._next_page is None:
                    raise
            except httpx.HTTPError as e:
                self.close()
                raise self._client._connection_failed(e) from e
            self._response = self._next_page(cursor)
            self._lines = self._response.iter_lines()

    def close(self) -> None:
        self._response.close()


class Trainings:
    """`client.trainings`: submit trainings and follow them to their trained model."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        manifest: ManifestSource,
        code: CodeSource,
        *,
        progress: ProgressCallback | None = None,
    ) -> Training:
        """Submit a training: `POST /v1/trainings`.

        `manifest` is the path of a YAML or JSON manifest, or the manifest as a dict.
        `code` is a directory (archived as a zip, without `__pycache__`, `.git` and `*.pyc`),
        the path of a `.zip` or `.tar.gz` archive, or an archive's bytes. `progress` is
        called as the upload goes. Returns the training, QUEUED.
        Raises `ValidationError` naming each offending field (`/compute_configuration/nodes`,
        `model_definition`...) if the manifest breaks a rule or the archive is unsafe,
        `PayloadTooLarge` above the upload limit, `OSError` if a path cannot be read.
        """
        manifest_name, manifest_bytes = _manifest_part(manifest)
        with tempfile.TemporaryFile() as spool:
            if isinstance(code, bytes):
                name = "code.tar.gz" if code[:2] == b"\x1f\x8b" else "code.zip"
                spool.write(code)
            else:
                path = Path(code)
                if path.is_dir():
                    name = "code.zip"
                    _zip_directory(path, spool)
                else:
                    name = path.name
                    with path.open("rb") as f:
                        while chunk := f.read(1024 * 1024):
                            spool.write(chunk)
            total = spool.tell()
            spool.seek(0)
            body: IO[bytes] | _ProgressReader = (
                _ProgressReader(spool, total, progress) if progress else spool
            )
            data = self._client._json(
                "POST",
                "/v1/trainings",
                files={
                    "manifest": (manifest_name, manifest_bytes, "application/octet-stream"),
                    "model_definition": (name, body, "application/octet-stream"),
                },
            )
        return Training.from_json(data)

    def list(
        self, *, status: str | None = None, limit: int | None = None
    ) -> builtins.list[Training]:
        """The tenant's trainings, newest first: `GET /v1/trainings`, every page.

        `status` keeps only trainings in that state; `limit` caps how many are returned.
        Raises `ValidationError` for an unknown status.
        """
        found: builtins.list[Training] = []
        cursor: str | None = None
        while limit is None or len(found) < limit:
            page_size = 100 if limit is None else min(100, limit - len(found))
            page = self.page(status=status, limit=page_size, cursor=cursor)
            found.extend(page.items)
            cursor = page.next_cursor
            if not cursor:
                break
        return found

    def page(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page[Training]:
        """One page of the tenant's trainings, newest first: `GET /v1/trainings` as the API
        answers it (`raw`: `{"items": [...], "next_cursor": ...}`).

        `limit` trainings at most (1..500); `cursor` is the `next_cursor` of the page before,
        None for the first. Raises `ValidationError` for an unknown status, `BadRequest` for
        a cursor the API did not give.
        """
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        data = self._client._json("GET", "/v1/trainings", params=params)
        return Page(
            tuple(Training.from_json(item) for item in data["items"]),
            data.get("next_cursor"),
            data,
        )

    def get(self, training_id: str) -> Training:
        """The training now: `GET /v1/trainings/{id}`. Raises `NotFound`."""
        return Training.from_json(self._client._json("GET", f"/v1/trainings/{training_id}"))

    def wait(
        self, training_id: str, timeout: float | None = None, *, poll_interval: float = 1.0
    ) -> Training:
        """Wait until the training has ended (COMPLETED, FAILED or HALTED) and return it.

        Check `.status` (or `.succeeded`): a failed training is returned, not raised.
        Raises `WaitTimeout` (carrying the last state in `.last`) after `timeout` seconds,
        `NotFound` if there is no such training.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            training = self.get(training_id)
            if training.terminal:
                return training
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(
                        f"training {training_id} is still {training.status} after {timeout} s",
                        training,
                    )
                time.sleep(min(poll_interval, left))
            else:
                time.sleep(poll_interval)

    def logs(
        self,
        training_id: str,
        *,
        follow: bool = False,
        learner: int | None = None,
        since: str | float | datetime | None = None,
    ) -> LogStream:
        """Every learner's output: `GET /v1/trainings/{id}/logs`, as an iterator of lines.

        Without `follow`, the log so far, read a page (at most 1 MiB) at a time as the
        iterator goes. With `follow`, the lines arrive as the learners print them and the
        iterator ends when the training has ended; a tenant may follow only so many logs at
        once (`RateLimited` above that). `learner` keeps one learner's lines (1..N);
        `since` (ISO time, epoch seconds or datetime) drops older ones. Raises `NotFound`
        here, and `ConnectionFailed` while iterating if the connection breaks.
        """
        params: dict[str, Any] = {"follow": "true" if follow else "false"}
        if learner is not None:
            params["learner"] = learner
        if (stamp := _since(since)) is not None:
            params["since"] = stamp
        path = f"/v1/trainings/{training_id}/logs"
        if follow:
            timeout = httpx.Timeout(self._client.timeout, read=None)
            response = self._client._open_stream("GET", path, params=params, timeout=timeout)
            return LogStream(self._client, response)

        def page(cursor: str) -> httpx.Response:
            return self._client._open_stream("GET", path, params={**params, "cursor": cursor})

        return LogStream(self._client, self._client._open_stream("GET", path, params=params), page)

    def metrics(self, training_id: str) -> dict[str, builtins.list[MetricPoint]]:
        """The manifest's evaluation metrics as read from the logs so far:
        `{name: [MetricPoint(value, learner, timestamp, step), ...]}` in log order, every
        metric present (empty if nothing matched). Raises `NotFound`."""
        data = self._client._json("GET", f"/v1/trainings/{training_id}/metrics")
        return {name: [MetricPoint.from_json(p) for p in points] for name, points in data.items()}

    def stop(self, training_id: str) -> Training:
        """Stop the training: `POST /v1/trainings/{id}/stop`.

        Returns it HALTED if no learner had started, else with `stop_requested` set while
        its learners are being stopped (`wait` for HALTED). Raises `Conflict` if it had
        already ended, `NotFound`.
        """
        return Training.from_json(self._client._json("POST", f"/v1/trainings/{training_id}/stop"))

    def delete(self, training_id: str) -> None:
        """Delete the training with its stored code, results and logs:
        `DELETE /v1/trainings/{id}`. A running training is stopped first and deleted once its
        learners are gone. Raises `NotFound`."""
        self._client._request("DELETE", f"/v1/trainings/{training_id}")

    def results(self, training_id: str) -> builtins.list[ResultFile]:
        """The stored results of the training (`GET /v1/trainings/{id}/results`, every
        page): the learners' logs and whatever they wrote to $RESULT_DIR. Raises
        `NotFound`."""
        files: builtins.list[ResultFile] = []
        url = f"/v1/trainings/{training_id}/results"
        cursor: str | None = None
        while True:
            params = {"cursor": cursor} if cursor is not None else None
            data = self._client._json("GET", url, params=params)
            files += [ResultFile.from_json(item) for item in data["files"]]
            cursor = data.get("next_cursor")
            if not cursor:
                return files

    def result(self, training_id: str, path: str, out: IO[bytes], *, offset: int = 0) -> bool:
        """Write one stored result file (`GET /v1/trainings/{id}/results/{path}`, `path` as
        `results` lists it) to `out`.

        With `offset` > 0 only the bytes from `offset` on are asked for (a Range request),
        to append to a copy that has the first `offset` bytes: `out` must then be seekable,
        and is written at its position when the server sends that range (True is returned),
        or emptied and given the whole file when it sends all of it (False). Raises
        `NotFound`; `ApiError` (416) when `offset` is not before the file's end."""
        headers = {"Range": f"bytes={offset}-"} if offset > 0 else {}
        with self._client._stream(
            "GET", f"/v1/trainings/{training_id}/results/{quote(path, safe='/')}", headers=headers
        ) as response:
            if offset > 0 and response.status_code != 206:
                out.seek(0)
                out.truncate()
            try:
                for chunk in response.iter_bytes(_CHUNK):
                    out.write(chunk)
            except httpx.HTTPError as e:
                raise self._client._connection_failed(e) from e
            return offset == 0 or response.status_code == 206

    def download(
        self,
        training_id: str,
        dest: str | os.PathLike[str],
        *,
        progress: ProgressCallback | None = None,
    ) -> builtins.list[Path]:
        """Download the training's results (`GET /v1/trainings/{id}/results.tar.gz`) and
        unpack them into the directory `dest` (created if needed).

        Returns the files written, sorted: what the learners wrote to $RESULT_DIR (a
        SavedModel in `dest/model/`) and each learner's log in
        `dest/learner-<i>/training-log.txt`. Raises `NotFound` if the
        training or its results do not exist; entries of the archive that would land outside
        `dest` are refused (`tarfile.FilterError`).
        """
        target = Path(dest)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as spool:
            self._fetch(f"/v1/trainings/{training_id}/results.tar.gz", spool, progress)
            spool.seek(0)
            with tarfile.open(fileobj=spool, mode="r:*") as archive:
                members = _strip_top_directory(archive.getmembers())
                archive.extractall(target, members=members, filter="data")
        root = target.resolve()
        return sorted(root / m.name for m in members if m.isfile())

    def model_definition(
        self,
        training_id: str,
        dest: str | os.PathLike[str],
        *,
        progress: ProgressCallback | None = None,
    ) -> Path:
        """Download the code archive that was submitted (`GET
        /v1/trainings/{id}/model_definition`) to the file `dest`; returns its path.
        Raises `NotFound`."""
        target = Path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as out:
            self._fetch(f"/v1/trainings/{training_id}/model_definition", out, progress)
        return target

    def _fetch(self, path: str, out: IO[bytes], progress: ProgressCallback | None) -> None:
        with self._client._stream("GET", path) as response:
            length = response.headers.get("content-length")
            total = int(length) if length and length.isdigit() else None
            done = 0
            try:
                for chunk in response.iter_bytes(_CHUNK):
                    out.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
            except httpx.HTTPError as e:
                raise self._client._connection_failed(e) from e


class Tenants:
    """`client.tenants`: tenants (admin key only) and their API keys (the admin key for
    any tenant, or a tenant's own key for its own keys)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, name: str, plan: str = "standard") -> Tenant:
        """Create a tenant on `plan` (`lite` or `standard` by default): `POST /v1/tenants`.

        Returns it with its `api_key`, which is shown this once. Raises `Conflict` if the
        name is taken, `ValidationError` for an unknown plan or a bad name, `Forbidden` when
        the client does not hold the admin key.
        """
        body = {"name": name, "plan": plan}
        return Tenant.from_json(self._client._json("POST", "/v1/tenants", json=body))

    def list(self) -> builtins.list[Tenant]:
        """Every tenant: `GET /v1/tenants`. Raises `Forbidden` without the admin key."""
        data = self._client._json("GET", "/v1/tenants")
        return [Tenant.from_json(item) for item in data["items"]]

    def create_key(self, tenant_id: str) -> ApiKey:
        """Issue another API key for the tenant: `POST /v1/tenants/{id}/keys`.

        Returns it with its `api_key`, shown this once; the tenant's other keys stay valid.
        To rotate: create one, switch to it, `revoke_key` the old one. Raises `NotFound`
        for an unknown tenant (or another tenant's, with a tenant's key), `Conflict` when
        the tenant holds too many valid keys.
        """
        return ApiKey.from_json(self._client._json("POST", f"/v1/tenants/{tenant_id}/keys"))

    def list_keys(self, tenant_id: str) -> builtins.list[ApiKey]:
        """The tenant's API keys, revoked ones too, oldest first: `GET
        /v1/tenants/{id}/keys`. Raises `NotFound`."""
        data = self._client._json("GET", f"/v1/tenants/{tenant_id}/keys")
        return [ApiKey.from_json(item) for item in data["items"]]

    def revoke_key(self, tenant_id: str, key_id: str) -> None:
        """Revoke the key `key_id` (an id from `list_keys`, not the key): `DELETE
        /v1/tenants/{id}/keys/{key_id}`. Every API process refuses it within a second;
        revoking it again changes nothing. Raises `NotFound`."""
        self._client._request("DELETE", f"/v1/tenants/{tenant_id}/keys/{key_id}")
