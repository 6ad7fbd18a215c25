"""The SSRF guard on users' S3 endpoints, byte ranges, and credentials at rest (pure)."""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from service.api.results import RangeNotSatisfiable, byte_range
from service.secrets import (
    MASK,
    SecretBox,
    SecretsUnreadable,
    ensure_secret_key,
    masked_reference,
    open_reference,
    seal_manifest,
)
from service.settings import Settings
from service.storage.endpoints import EndpointPolicy, IPAddress

DNS = {
    "s3.example.com": ["52.1.2.3"],
    "evil.example.com": ["169.254.169.254"],
    "mixed.example.com": ["52.1.2.4", "10.0.0.7"],
    "v6.example.com": ["::ffff:127.0.0.1"],
    "minio.internal": ["10.1.2.3"],
}


def fake_resolve(host: str, port: int) -> Sequence[IPAddress]:
    return [ipaddress.ip_address(a) for a in DNS.get(host, [])]


def policy(tmp_path: Path, **settings: str) -> EndpointPolicy:
    return EndpointPolicy.from_settings(Settings(home=tmp_path, **settings), fake_resolve)  # type: ignore[arg-type]


CLUSTER = {"database_url": "postgresql+psycopg://db/dlaas", "s3_endpoint": "http://minio:9000"}


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://minio:9000", True),  # the platform's own endpoint
        ("http://minio:9001", False),
        ("https://minio:9000", False),
        ("http://127.0.0.1:9000", False),  # loopback is internal in a cluster
        ("http://169.254.169.254", False),
        ("http://10.0.0.1:9000", False),
        ("https://s3.example.com", False),  # not listed
    ],
)
def test_cluster_default_is_the_platform_endpoint_only(
    tmp_path: Path, url: str, allowed: bool
) -> None:
    assert (policy(tmp_path, **CLUSTER).refusal(url) is None) is allowed


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:9000", True),
        ("http://localhost:1234", True),
        ("http://[::1]:9000", True),
        ("http://127.5.5.5", True),
        ("http://169.254.169.254", False),
        ("http://192.168.1.10:9000", False),
        ("http://s3.example.com", False),
    ],
)
def test_one_machine_default_adds_loopback(tmp_path: Path, url: str, allowed: bool) -> None:
    assert (policy(tmp_path).refusal(url) is None) is allowed


def test_configured_entries(tmp_path: Path) -> None:
    p = policy(
        tmp_path,
        **CLUSTER,
        allowed_data_endpoints="https://s3.example.com, minio.internal:9000, *.example.com,"
        " [fd00::1]:9000",
    )
    assert p.refusal("https://s3.example.com") is None
    assert p.refusal("https://s3.example.com:443/") is None
    assert p.refusal("http://minio.internal:9000") is None  # named: may be private
    assert p.refusal("http://minio:9000") is None  # the platform's own, always
    assert p.refusal("http://[fd00::1]:9000") is None
    assert "not an allowed" in (p.refusal("http://minio.internal:80") or "")
    assert "not an allowed" in (p.refusal("http://127.0.0.1:9000") or "")  # list replaces
    # Wildcards need public addresses only.
    assert p.refusal("http://other.example.com") == "the host 'other.example.com' does not resolve"
    assert "169.254.169.254" in (p.refusal("http://evil.example.com") or "")
    assert "10.0.0.7" in (p.refusal("https://mixed.example.com") or "")
    assert "::ffff:7f00:1" in (p.refusal("https://v6.example.com") or "")
    anything = policy(tmp_path, **CLUSTER, allowed_data_endpoints="*")
    assert anything.refusal("https://s3.example.com") is None
    assert anything.refusal("http://evil.example.com") is not None


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1",
        "127.0.0.1:9000",
        "http://user:pw@127.0.0.1:9000",
        "http://127.0.0.1:9000/bucket",
        "http://127.0.0.1:9000?x=1",
        "http://127.0.0.1:99999",
        "http://",
    ],
)
def test_malformed_endpoints_are_refused(tmp_path: Path, url: str) -> None:
    assert policy(tmp_path).refusal(url) is not None


def test_a_bad_allowlist_entry_is_a_startup_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ftp://x"):
        policy(tmp_path, allowed_data_endpoints="ftp://x")


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, None),
        ("bytes=0-0", 10, (0, 1)),
        ("bytes=2-5", 10, (2, 6)),
        ("bytes=2-", 10, (2, 10)),
        ("bytes=-3", 10, (7, 10)),
        ("bytes=-30", 10, (0, 10)),
        ("bytes=5-100", 10, (5, 10)),
        ("bytes=5-2", 10, None),  # invalid: ignored, the whole file
        ("bytes=0-1,4-5", 10, None),  # several ranges: the whole file
        ("items=0-1", 10, None),
        ("bytes=a-b", 10, None),
        ("bytes=--3", 10, None),
        ("bytes=-", 10, None),
    ],
)
def test_byte_ranges(header: str | None, size: int, expected: tuple[int, int] | None) -> None:
    assert byte_range(header, size) == expected


@pytest.mark.parametrize(("header", "size"), [("bytes=10-", 10), ("bytes=-0", 10), ("bytes=-1", 0)])
def test_unsatisfiable_ranges(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiable) as err:
        byte_range(header, size)
    assert err.value.headers["Content-Range"] == f"bytes */{size}"


REF = {
    "type": "s3",
    "connection": {
        "endpoint_url": "http://127.0.0.1:9000",
        "access_key_id": "AKIA-USER",
        "secret_access_key": "user-secret",
    },
    "source": {"bucket": "data"},
}


def test_credentials_are_sealed_masked_and_opened(tmp_path: Path) -> None:
    box = SecretBox(ensure_secret_key(Settings(home=tmp_path)))
    key_file = tmp_path / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert ensure_secret_key(Settings(home=tmp_path)) == key_file.read_text().strip()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".secret_key")]
    doc = {"name": "x", "training_data_reference": REF, "training_results_reference": REF}
    sealed = seal_manifest(doc, box)
    assert doc["training_data_reference"] is REF and REF["connection"]["access_key_id"] == (
        "AKIA-USER"
    )
    text = repr(sealed)
    assert "AKIA-USER" not in text and "user-secret" not in text
    for name in ("training_data_reference", "training_results_reference"):
        assert open_reference(sealed[name], box) == REF
        masked = masked_reference(sealed[name])
        assert masked is not None
        assert masked["connection"] == {
            "endpoint_url": "http://127.0.0.1:9000",
            "access_key_id": MASK,
            "secret_access_key": MASK,
        }
    other = SecretBox("another key")
    with pytest.raises(SecretsUnreadable, match="DLAAS_SECRET_KEY"):
        open_reference(sealed["training_data_reference"], other)
    with pytest.raises(SecretsUnreadable):
        open_reference(REF, box)  # never decrypts what was not encrypted
    assert ensure_secret_key(Settings(home=tmp_path, secret_key="from-env")) == "from-env"  # type: ignore[arg-type]
