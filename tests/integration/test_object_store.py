"""One contract, two stores: the local directory and a real S3 endpoint (moto's server)."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from service.storage import open_platform_store
from service.storage.base import ObjectNotFound, ObjectStore, StoreUnavailable
from service.storage.local import LocalObjectStore
from service.storage.s3 import MIN_PART_SIZE, S3ObjectStore
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, free_port, moto_server

pytestmark = pytest.mark.integration

BIG = 55 * 1024 * 1024  # > 50 MB: several parts of MIN_PART_SIZE
_bucket_names = (f"contract-{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


def s3_store(server: S3Server, bucket: str, **kwargs: object) -> S3ObjectStore:
    return S3ObjectStore(
        server.url,
        bucket,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        part_size=MIN_PART_SIZE,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalObjectStore(tmp_path / "objects")
    server: S3Server = request.getfixturevalue("s3")
    return s3_store(server, next(_bucket_names), create_bucket=True)


def read(store: ObjectStore, key: str) -> bytes:
    with store.open(key) as f:
        return f.read()


class _Unsized(io.RawIOBase):
    """A stream of `size` pseudo-random bytes whose length nobody knows in advance."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left, 256 * 1024)
        data = os.urandom(n)
        buffer[:n] = data
        self.sha.update(data)
        self.left -= n
        return n


def test_put_open_stat_and_missing(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"hello object store")
    info = store.put_file("trainings/t1/model_definition.zip", src)
    assert (info.key, info.size) == ("trainings/t1/model_definition.zip", 18)
    assert read(store, "trainings/t1/model_definition.zip") == b"hello object store"
    stat = store.stat("trainings/t1/model_definition.zip")
    assert stat is not None and stat.size == 18
    assert abs(stat.last_modified.timestamp() - time.time()) < 120
    assert store.stat("trainings/t1/nope") is None
    with pytest.raises(ObjectNotFound):
        store.open("trainings/t1/nope")
    with pytest.raises(ObjectNotFound):
        store.open_range("trainings/t1/nope", 0, 1)
    # Overwrite replaces the whole object.
    info = store.put_stream("trainings/t1/model_definition.zip", io.BytesIO(b"v2"), 2)
    assert read(store, "trainings/t1/model_definition.zip") == b"v2"


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a/.", "..", "a\0b"])
def test_keys_that_climb_or_are_absolute_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put_stream(key, io.BytesIO(b"x"), 1)
    with pytest.raises(ValueError):
        store.stat(key)


def test_list_is_by_directory_prefix_in_key_order(store: ObjectStore) -> None:
    keys = [
        "trainings/t1/results/model/saved_model.pb",
        "trainings/t1/results/learner-1/training-log.txt",
        "trainings/t1/results/a.txt",
        "trainings/t1/results2/other.txt",
        "trainings/t1/model_definition.zip",
    ]
    for i, key in enumerate(keys):
        store.put_stream(key, io.BytesIO(b"x" * i), i)
    listed = [(o.key, o.size) for o in store.list("trainings/t1/results")]
    assert listed == [
        ("trainings/t1/results/a.txt", 2),
        ("trainings/t1/results/learner-1/training-log.txt", 1),
        ("trainings/t1/results/model/saved_model.pb", 0),
    ]
    assert [o.key for o in store.list("trainings/t1/results/")] == [k for k, _ in listed]
    assert [o.key for o in store.list("")] == sorted(keys)
    assert list(store.list("trainings/none")) == []


def test_list_after_a_key_is_s3s_order_with_directories_where_s3_puts_them(
    store: ObjectStore,
) -> None:
    """Keys whose directories and names sort differently than their full keys ("a-c" <
    "a/b" < "a0"): the local store lists them in S3's order, from any `start_after`."""
    names = ["a/b", "a-c", "a0", "a/b/c/d", "a/bb", "b", "a/b-", "a/b/c-"]
    names = [n for n in names if not any(m.startswith(n + "/") for m in names)]
    for name in names:
        store.put_stream(f"p/{name}", io.BytesIO(b"x"), 1)
    everything = sorted(f"p/{n}" for n in names)
    assert [o.key for o in store.list("p")] == everything
    for i, after in enumerate(["p/", *everything, "p/a/", "p/a/b/", "p/a/b/c", "p/zzz"]):
        expected = [k for k in everything if k > after]
        assert [o.key for o in store.list("p", after)] == expected, (i, after)


def test_delete_prefix(store: ObjectStore) -> None:
    for key in ["t/1/a", "t/1/b/c", "t/10/a", "t/2/a"]:
        store.put_stream(key, io.BytesIO(b"x"), 1)
    assert store.delete_prefix("t/1") == 2
    assert [o.key for o in store.list("t")] == ["t/10/a", "t/2/a"]
    assert store.delete_prefix("t/2/a") == 1  # a single object
    assert store.delete_prefix("t/nothing/") == 0
    assert [o.key for o in store.list("")] == ["t/10/a"]


def test_range_reads(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    store.put_stream("r/data.bin", io.BytesIO(data), len(data))
    for start, end in [(0, 1), (10, 20), (100, None), (len(data) - 1, None), (5, 5)]:
        with store.open_range("r/data.bin", start, end) as f:
            assert f.read() == data[start:end], (start, end)
    with store.open_range("r/data.bin", 1000, 3000) as f:  # read in small pieces
        pieces = iter(lambda: f.read(7), b"")
        assert b"".join(pieces) == data[1000:3000]
    with store.open_range("r/data.bin", len(data) + 10) as f:  # past the end: nothing
        assert f.read() == b""
    with pytest.raises(ValueError):
        store.open_range("r/data.bin", 10, 5)


def test_put_stream_of_unknown_length_is_streamed(store: ObjectStore) -> None:
    stream = _Unsized(3 * MIN_PART_SIZE + 12345)  # several parts on S3
    info = store.put_stream("u/unsized.bin", stream)  # type: ignore[arg-type]
    assert info.size == 3 * MIN_PART_SIZE + 12345
    sha = hashlib.sha256()
    with store.open("u/unsized.bin") as f:
        while chunk := f.read(1024 * 1024):
            sha.update(chunk)
    assert sha.hexdigest() == stream.sha.hexdigest()


def test_a_short_stream_leaves_no_object(store: ObjectStore) -> None:
    with pytest.raises((ValueError, OSError)):
        store.put_stream("s/short.bin", io.BytesIO(b"only this"), 100)
    assert store.stat("s/short.bin") is None
    assert list(store.list("s")) == []


def test_a_large_object_is_streamed_both_ways(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    sha = hashlib.sha256()
    with src.open("wb") as f:
        for _ in range(BIG // (1024 * 1024)):
            chunk = os.urandom(1024 * 1024)
            sha.update(chunk)
            f.write(chunk)
    tracemalloc.start()
    try:
        info = store.put_file("big/model.bin", src)
        _, upload_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        back = hashlib.sha256()
        size = 0
        with store.open("big/model.bin") as f:
            while chunk := f.read(1024 * 1024):
                back.update(chunk)
                size += len(chunk)
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.size == size == BIG
    assert back.hexdigest() == sha.hexdigest()
    # Never the whole object in memory: a part or a chunk at a time.
    assert upload_peak < 4 * MIN_PART_SIZE, upload_peak
    assert download_peak < 4 * MIN_PART_SIZE, download_peak
    if isinstance(store, S3ObjectStore):  # a multipart upload's ETag is "<md5>-<parts>"
        etag = store.client.stat_object(store.bucket, "big/model.bin").etag
        assert etag is not None and etag.endswith(f"-{-(-BIG // MIN_PART_SIZE)}"), etag
    with store.open_range("big/model.bin", BIG - 10) as f:
        assert len(f.read()) == 10


def test_presigned_urls_where_the_store_has_them(store: ObjectStore) -> None:
    store.put_stream("p/file.txt", io.BytesIO(b"presigned"), 9)
    url = store.presigned_url("p/file.txt", 60)
    if isinstance(store, LocalObjectStore):
        assert url is None
        return
    assert url is not None and "X-Amz-Signature" in url
    assert httpx.get(url).content == b"presigned"


# -- S3 failures: fast, and naming the store and the bucket ---------------------------------


def test_a_missing_bucket_is_named(s3: S3Server) -> None:
    store = s3_store(s3, "no-such-bucket")
    for call in (
        lambda: store.open("k"),
        lambda: list(store.list("")),
        lambda: store.put_stream("k", io.BytesIO(b"x"), 1),
        store.check_bucket,
    ):
        with pytest.raises(StoreUnavailable) as err:
            call()
        assert f"the S3 store at {s3.url} has no bucket 'no-such-bucket'" in str(err.value)
        assert SECRET_KEY not in str(err.value)


def test_an_unreachable_endpoint_fails_fast_and_names_the_store() -> None:
    port = free_port()
    store = S3ObjectStore(
        f"http://127.0.0.1:{port}", "data", access_key=ACCESS_KEY, secret_key=SECRET_KEY
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as err:
        store.open("k")
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert f"the S3 store at http://127.0.0.1:{port} (bucket 'data') is unreachable" in message
    assert "refused" in message.lower()
    assert SECRET_KEY not in message and ACCESS_KEY not in message


def test_the_platform_store_is_s3_when_the_endpoint_is_set(s3: S3Server, tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path / "home",
        s3_endpoint=s3.url,
        s3_access_key=ACCESS_KEY,
        s3_secret_key=SECRET_KEY,  # type: ignore[arg-type]
        s3_bucket="platform-bucket",
    )
    store = open_platform_store(settings)
    assert isinstance(store, S3ObjectStore)
    store.put_stream("trainings/x/model_definition.zip", io.BytesIO(b"zip"), 3)  # creates it
    assert s3.objects("platform-bucket") == {"trainings/x/model_definition.zip": b"zip"}
    assert not (tmp_path / "home" / "objects").exists()
    assert SECRET_KEY not in repr(settings) and SECRET_KEY not in repr(store)
    local = open_platform_store(Settings(home=tmp_path / "home"))
    assert isinstance(local, LocalObjectStore)
    with pytest.raises(ValueError, match="DLAAS_S3_ENDPOINT"):
        open_platform_store(Settings(home=tmp_path, s3_endpoint="127.0.0.1:9000/path"))
    with pytest.raises(ValueError, match="DLAAS_S3_BUCKET"):
        open_platform_store(Settings(home=tmp_path, s3_endpoint=s3.url, s3_bucket="X"))
