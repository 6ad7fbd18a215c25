"""An object store in an S3 bucket (MinIO, AWS S3, any S3-compatible endpoint) through the
`minio` client.

Uploads are streamed: an object of known length up to the part size is one PUT, anything
larger (or of unknown length) a multipart upload that holds at most a few parts in memory
and is aborted on failure, so readers never see half an object. Downloads stream the
response body. Every failure of the store itself (unreachable endpoint, missing bucket,
refused credentials) is a StoreUnavailable whose message names the endpoint and the bucket,
never the credentials.

The client follows no redirect: an endpoint that answers with one (to a cloud metadata
address, say) fails the operation, naming the endpoint. A user's bucket is reached through
`connect_to` (service.storage.endpoints.AddressPins.address): every connection goes to the
address checked for its host, the name kept for the Host header, SNI and the certificate.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError

from service.storage.base import (
    DEFAULT_PART_SIZE,
    ObjectInfo,
    ObjectNotFound,
    StoreUnavailable,
    check_key,
    directory_prefix,
)

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part (but the last)
DEFAULT_REGION = "us-east-1"
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_ACCESS_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
}


def parse_endpoint(url: str) -> tuple[str, bool]:
    """`http://host:9000` -> ("host:9000", False); `https://host` -> ("host", True).

    Raises ValueError for anything that is not scheme://host[:port] (no path, no query, no
    user information).
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"has an invalid port: {e}") from e
    if not parts.hostname:
        raise ValueError("has no host name")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not contain user information; use the credential fields")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("must be scheme://host[:port], without a path or query")
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return netloc, parts.scheme == "https"


def check_bucket_name(name: str) -> str | None:
    """Why `name` is not a valid S3 bucket name, or None if it is."""
    if not _BUCKET_NAME.match(name) or ".." in name:
        return (
            "must be 3 to 63 characters of lower-case letters, digits, '.' and '-', "
            "starting and ending with a letter or digit"
        )
    return None


# A user's bucket may also have underscores (`tf_training_data`, as FfDL's examples name
# them): S3's legacy rule, which MinIO's client and S3-compatible endpoints that keep it
# accept (with path-style requests); an endpoint that does not answers so itself.
_USER_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._\-]{1,61}[a-z0-9]$")
_IPV4 = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def check_user_bucket_name(name: str) -> str | None:
    """Why `name` cannot name a user's data or results bucket, or None if it can: the
    platform's rule (check_bucket_name) with underscores allowed."""
    if (
        not _USER_BUCKET_NAME.match(name)
        or any(pair in name for pair in ("..", ".-", "-."))
        or _IPV4.match(name)
    ):
        return (
            "must be 3 to 63 characters of lower-case letters, digits, '.', '-' and '_' "
            "(underscores where the S3 endpoint allows them), starting and ending with a "
            "letter or digit, not an IP address"
        )
    return None


class RedirectRefused(HTTPError):
    """The endpoint answered with a redirect, which is never followed."""

    def __init__(self, status: int, location: str) -> None:
        super().__init__(f"answered {status} redirecting to {location[:200]!r}")
        self.status = status
        self.location = location


class AddressRefused(HTTPError):
    """`connect_to` refused the address a host resolves to; the message says why."""


class _EndpointPools(urllib3.PoolManager):
    """urllib3's pool manager, following no redirect (a 3xx with a Location raises
    RedirectRefused), and with `connect_to` connecting each host to the address that
    function gives (checked and pinned), keeping the name for TLS (SNI and the
    certificate); the Host header is the client's (minio sets it)."""

    def __init__(self, connect_to: Callable[[str, int], str] | None, **kw: Any) -> None:
        super().__init__(**kw)
        self._connect_to = connect_to

    def connection_from_host(
        self,
        host: str | None,
        port: int | None = None,
        scheme: str | None = "http",
        pool_kwargs: dict[str, Any] | None = None,
    ) -> HTTPConnectionPool:
        if self._connect_to is None or not host:
            return super().connection_from_host(host, port, scheme, pool_kwargs)
        scheme = (scheme or "http").lower()
        port = port or (443 if scheme == "https" else 80)
        name = host.strip("[]")
        try:
            address = self._connect_to(name, port)
        except ValueError as e:
            raise AddressRefused(str(e)) from e
        if scheme == "https":
            pool_kwargs = {**(pool_kwargs or {}), "server_hostname": name}
        return super().connection_from_host(address, port, scheme, pool_kwargs)

    def urlopen(  # type: ignore[override]  # as urllib3's own PoolManager.urlopen
        self, method: str, url: str, redirect: bool = True, **kw: Any
    ) -> urllib3.BaseHTTPResponse:
        response = super().urlopen(method, url, redirect=False, **kw)
        location = response.get_redirect_location()
        if location:
            response.drain_conn()
            raise RedirectRefused(response.status, location)
        return response


class _Counting:
    """Counts what is read through it (for the size of an upload of unknown length)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.count += len(data)
        return data


class _Body(io.RawIOBase):
    """An object's body as a file: reads stream from the HTTP response, close() releases it."""

    def __init__(self, response: urllib3.BaseHTTPResponse, store: S3ObjectStore) -> None:
        self._response = response
        self._store = store

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._response.readinto(buffer)
        except HTTPError as e:
            raise self._store.unavailable(e) from e

    def close(self) -> None:
        if not self.closed:
            self._response.close()
            self._response.release_conn()
        super().close()


class S3ObjectStore:
    """Objects in one bucket of an S3 endpoint.

    `create_bucket`: create the bucket on first use if it is missing (the platform's own
    store); otherwise a missing bucket is a StoreUnavailable (users' buckets).
    """

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        region: str | None = None,
        create_bucket: bool = False,
        part_size: int = DEFAULT_PART_SIZE,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        retries: int = 2,
        connect_to: Callable[[str, int], str] | None = None,
    ) -> None:
        netloc, secure = parse_endpoint(endpoint)
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes")
        self.endpoint = f"{'https' if secure else 'http'}://{netloc}"
        self.bucket = bucket
        self.region = region or DEFAULT_REGION
        self.part_size = part_size
        self.description = f"the S3 store at {self.endpoint} (bucket {bucket!r})"
        http = _EndpointPools(
            connect_to,
            timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
            maxsize=10,
            retries=urllib3.Retry(
                total=retries,
                connect=retries,
                read=retries,
                redirect=0,  # never followed (_EndpointPools), and never retried as one
                backoff_factor=0.2,
                status_forcelist=[500, 502, 503, 504],
            ),
        )
        # The region is given so the client never asks the endpoint for it first.
        self.client = Minio(
            netloc,
            access_key=access_key or None,
            secret_key=secret_key or ("" if access_key else None),
            session_token=session_token or None,
            secure=secure,
            region=self.region,
            http_client=http,
        )
        self._create_bucket = create_bucket
        self._ready = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.endpoint!r}, {self.bucket!r})"

    # -- errors ----------------------------------------------------------------------------

    def unavailable(self, error: BaseException) -> StoreUnavailable:
        """The StoreUnavailable for a failure of the store (never naming credentials)."""
        where = f"the S3 store at {self.endpoint}"
        if isinstance(error, S3Error):
            if error.code == "NoSuchBucket":
                return StoreUnavailable(f"{where} has no bucket {self.bucket!r}")
            if error.code in _ACCESS_CODES:
                return StoreUnavailable(
                    f"{where} refused access to bucket {self.bucket!r} ({error.code}); "
                    "check the access key and secret"
                )
            return StoreUnavailable(
                f"{where} (bucket {self.bucket!r}) failed: {error.code}: {error.message}"
            )
        if isinstance(error, RedirectRefused):
            return StoreUnavailable(
                f"{where} (bucket {self.bucket!r}) {error}; the platform follows no "
                "redirects from S3 endpoints"
            )
        if isinstance(error, AddressRefused):
            return StoreUnavailable(f"{where} (bucket {self.bucket!r}) cannot be used: {error}")
        if isinstance(error, MaxRetryError | NewConnectionError):
            reason = error.reason if isinstance(error, MaxRetryError) else error
            text = str(reason)
            if isinstance(reason, NewConnectionError):  # "<conn object at 0x..>: Failed to ..."
                text = text.split(": ", 1)[-1]
            return StoreUnavailable(f"{where} (bucket {self.bucket!r}) is unreachable: {text}")
        if isinstance(error, HTTPError):
            return StoreUnavailable(
                f"{where} (bucket {self.bucket!r}) is unreachable: {type(error).__name__}"
            )
        if isinstance(error, ServerError | InvalidResponseError):
            return StoreUnavailable(f"{where} (bucket {self.bucket!r}) failed: {error}")
        return StoreUnavailable(f"{where} (bucket {self.bucket!r}) failed: {error}")

    @contextlib.contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        try:
            yield
        except S3Error as e:
            if key is not None and e.code in ("NoSuchKey", "NoSuchObject"):
                raise ObjectNotFound(key) from e
            raise self.unavailable(e) from e
        except (MinioException, HTTPError) as e:
            raise self.unavailable(e) from e

    # -- the bucket --------------------------------------------------------------------------

    def check_bucket(self) -> None:
        """Raise StoreUnavailable unless the bucket exists and can be reached."""
        with self._errors():
            exists = self.client.bucket_exists(self.bucket)
        if not exists:
            raise StoreUnavailable(f"the S3 store at {self.endpoint} has no bucket {self.bucket!r}")

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing (idempotent, safe against concurrent creators)."""
        with self._errors():
            if self.client.bucket_exists(self.bucket):
                return
            try:
                self.client.make_bucket(self.bucket)
            except S3Error as e:
                if e.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

    def _use(self) -> None:
        if self._ready or not self._create_bucket:
            return
        with self._lock:
            if not self._ready:
                self.ensure_bucket()
                self._ready = True

    # -- objects -----------------------------------------------------------------------------

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        with path.open("rb") as src:
            return self.put_stream(key, src, path.stat().st_size)

    def put_stream(self, key: str, stream: BinaryIO, length: int | None = None) -> ObjectInfo:
        check_key(key)
        self._use()
        counting = _Counting(stream)
        with self._errors():
            self.client.put_object(
                self.bucket,
                key,
                counting,  # type: ignore[arg-type]  # a readable binary stream
                -1 if length is None else length,
                part_size=self.part_size,
                num_parallel_uploads=1,  # one part in memory at a time
            )
        return ObjectInfo(key, counting.count, datetime.now(UTC))

    def open(self, key: str) -> BinaryIO:
        return self._get(key, 0, 0)

    def open_range(self, key: str, start: int, end: int | None = None) -> BinaryIO:
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"invalid byte range [{start}, {end})")
        if end == start:
            return io.BytesIO(b"")
        return self._get(key, start, 0 if end is None else end - start)

    def _get(self, key: str, offset: int, length: int) -> BinaryIO:
        check_key(key)
        self._use()
        with self._errors(key):
            try:
                response = self.client.get_object(self.bucket, key, offset=offset, length=length)
            except S3Error as e:
                if e.code != "InvalidRange":
                    raise
                return io.BytesIO(b"")  # starts at or past the end: nothing, as from a file
        return io.BufferedReader(_Body(response, self), 1024 * 1024)

    def stat(self, key: str) -> ObjectInfo | None:
        check_key(key)
        self._use()
        try:
            with self._errors(key):
                obj = self.client.stat_object(self.bucket, key)
        except ObjectNotFound:
            return None
        return ObjectInfo(key, obj.size or 0, obj.last_modified or datetime.now(UTC))

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        directory = directory_prefix(prefix)
        self._use()
        with self._errors():
            for obj in self.client.list_objects(
                self.bucket,
                prefix=directory or None,
                recursive=True,
                start_after=start_after or None,
            ):
                name = obj.object_name
                if not name or name.endswith("/"):  # "folder" markers are not objects
                    continue
                modified = obj.last_modified or datetime.now(UTC)
                yield ObjectInfo(name, obj.size or 0, modified)

    def delete_prefix(self, prefix: str) -> int:
        exact = check_key(prefix.rstrip("/"))
        keys = [info.key for info in self.list(exact)]
        if self.stat(exact) is not None:  # as in a directory: a/b is deleted with a/b/...
            keys.append(exact)
        if not keys:
            return 0
        with self._errors():
            errors = list(self.client.remove_objects(self.bucket, map(DeleteObject, keys)))
        if errors:
            first = errors[0]
            raise StoreUnavailable(
                f"the S3 store at {self.endpoint} (bucket {self.bucket!r}) could not delete "
                f"{len(errors)} object(s), e.g. {first.name}: {first.code}"
            )
        return len(keys)

    def presigned_url(self, key: str, expires_seconds: int = 3600) -> str | None:
        check_key(key)
        with self._errors():
            url: str = self.client.presigned_get_object(
                self.bucket, key, expires=timedelta(seconds=expires_seconds)
            )
        return url
