"""The SSRF guard on users' S3 endpoints, byte ranges, and credentials at rest (pure)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest
import urllib3

from service.api.results import RangeNotSatisfiable, byte_range
from service.domain.records import Secret, SpecError
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
from service.storage import StoreConfigError, open_store
from service.storage.config import BucketLocation, StoreConfig
from service.storage.endpoints import EndpointPolicy, IPAddress, address_kind
from service.storage.s3 import AddressRefused, S3ObjectStore

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


ONE_MACHINE = {"s3_endpoint": "http://127.0.0.1:9000"}  # SQLite: dlaas up with a MinIO


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:9000", True),  # the platform's own endpoint
        ("http://127.0.0.1:9100", False),  # any other loopback port is not
        ("http://localhost:9000", False),
        ("http://[::1]:9000", False),
        ("http://127.5.5.5", False),
        ("http://169.254.169.254", False),
        ("http://192.168.1.10:9000", False),
        ("http://s3.example.com", False),
    ],
)
def test_one_machine_default_is_the_platform_endpoint_only(
    tmp_path: Path, url: str, allowed: bool
) -> None:
    assert (policy(tmp_path, **ONE_MACHINE).refusal(url) is None) is allowed


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "http://localhost:1234"])
def test_without_an_s3_endpoint_no_data_endpoint_is_allowed_by_default(
    tmp_path: Path, url: str
) -> None:
    assert "not an allowed data endpoint" in (policy(tmp_path).refusal(url) or "")


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
    assert "::ffff:7f00:1 (loopback)" in (p.refusal("https://v6.example.com") or "")
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
    assert policy(tmp_path, allowed_data_endpoints="127.0.0.1, *").refusal(url) is not None


def test_a_bad_allowlist_entry_is_a_startup_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ftp://x"):
        policy(tmp_path, allowed_data_endpoints="ftp://x")


# -- addresses: what an IPv6 address that carries an IPv4 one is ---------------------------


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("52.1.2.3", "public"),
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.0.0.5", "private"),
        ("100.64.0.1", "reserved"),  # shared address space (carrier-grade NAT)
        ("0.0.0.0", "unspecified"),  # noqa: S104  # an address, not a bind
        ("224.0.0.1", "multicast"),
        ("2606:4700::1111", "public"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("fec0::1", "private"),  # site-local
        ("4000::1", "reserved"),  # outside 2000::/3
        ("ff02::1", "multicast"),
        # IPv4-mapped ::ffff:a.b.c.d
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:52.1.2.3", "public"),
        # IPv4-compatible ::a.b.c.d
        ("::a9fe:a9fe", "link-local"),
        ("::127.0.0.1", "loopback"),
        ("::10.0.0.5", "private"),
        ("::52.1.2.3", "public"),
        # NAT64, the well-known prefix 64:ff9b::/96, and the local-use 64:ff9b:1::/48
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b::127.0.0.1", "loopback"),
        ("64:ff9b::10.0.0.5", "private"),
        ("64:ff9b::52.1.2.3", "public"),
        ("64:ff9b:1::a9fe:a9fe", "reserved"),
        # 6to4 2002:AABB:CCDD::/48
        ("2002:7f00:1::", "loopback"),
        ("2002:a9fe:a9fe::1", "link-local"),
        ("2002:a00:5::", "private"),
        ("2002:3401:203::", "public"),
        # Teredo 2001::/32: the server and the (obfuscated) client
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private"),  # client 192.0.2.45
        ("2001:0:3401:203:0:f5ff:5601:5601", "link-local"),  # client 169.254.169.254
        ("2001:0:3401:203:0:f5ff:cbfe:fcfc", "public"),  # 52.1.2.3, client 52.1.3.3
    ],
)
def test_address_kinds(address: str, kind: str) -> None:
    assert address_kind(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize("address", ["64:ff9b::a9fe:a9fe", "2002:7f00:1::", "::a9fe:a9fe"])
def test_a_wildcard_host_on_an_ipv6_form_of_a_private_address_is_refused(
    tmp_path: Path, address: str
) -> None:
    resolve = lambda host, port: [ipaddress.ip_address(address)]  # noqa: E731
    p = EndpointPolicy.from_settings(
        Settings(home=tmp_path, **CLUSTER, allowed_data_endpoints="*"),  # type: ignore[arg-type]
        resolve,
    )
    why = p.refusal("https://data.example.com") or ""
    assert f"resolves to {address} (" in why
    assert p.refusal(f"http://[{address}]:9000") is not None  # and the literal itself


# -- the learner's check: again, at use, pinned to the address checked ---------------------


class Rebinding:
    """A name that resolves to a public address the first time, then elsewhere."""

    def __init__(self, *answers: str) -> None:
        self.answers = [ipaddress.ip_address(a) for a in answers]
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> Sequence[IPAddress]:
        self.calls.append(host)
        return [self.answers[min(len(self.calls), len(self.answers)) - 1]]


def user_store(url: str, allowed: tuple[str, ...] | None) -> StoreConfig:
    return StoreConfig(
        kind="s3",
        endpoint=url,
        bucket="data",
        access_key=Secret("k"),
        secret_key=Secret("s"),
        allowed_endpoints=allowed,
    )


@pytest.mark.parametrize("private", ["10.0.0.5", "169.254.169.254", "64:ff9b::a9fe:a9fe"])
def test_a_name_that_re_resolves_to_a_private_address_is_refused_at_use(
    tmp_path: Path, private: str
) -> None:
    url = "http://data.example.com:9000"
    dns = Rebinding("52.1.2.3", private)
    p = EndpointPolicy.from_settings(
        Settings(home=tmp_path, **CLUSTER, allowed_data_endpoints="*.example.com"),  # type: ignore[arg-type]
        dns,
    )
    assert p.refusal(url) is None  # at submission: public
    config = user_store(url, p.entries_for(url))  # what the worker hands the learner
    assert config.allowed_endpoints == ("*.example.com",)
    with pytest.raises(StoreConfigError) as refused:
        open_store(config, resolve=dns)  # at use: the learner resolves again
    message = str(refused.value)
    assert message.startswith(f"the S3 endpoint {url} is refused: ")
    assert f"resolves to {private} (" in message
    assert dns.calls == ["data.example.com", "data.example.com"]


def test_the_store_connects_to_the_address_it_checked(tmp_path: Path) -> None:
    url = "https://data.example.com"
    dns = Rebinding("52.1.2.3", "52.1.2.4", "10.0.0.5")
    store = open_store(user_store(url, ("*.example.com",)), resolve=dns)
    assert isinstance(store, S3ObjectStore)
    pools = store.client._http  # what minio sends its requests through
    assert isinstance(pools, urllib3.PoolManager)
    for _ in range(3):  # every connection: the address checked, the name for TLS
        pool = pools.connection_from_url(f"{url}/data/key")
        assert (pool.host, pool.port) == ("52.1.2.3", 443)
        assert pool.conn_kw["server_hostname"] == "data.example.com"
    assert dns.calls == ["data.example.com"]  # resolved once
    # Another name the client makes of the endpoint (AWS's regional and virtual-host
    # names) is resolved once too, and must be public.
    for _ in range(2):
        pool = pools.connection_from_url("https://data.s3.us-east-1.example.com/key")
        assert (pool.host, pool.conn_kw["server_hostname"]) == (
            "52.1.2.4",
            "data.s3.us-east-1.example.com",
        )
    with pytest.raises(AddressRefused, match=r"10\.0\.0\.5 \(private\)"):
        pools.connection_from_url("https://other.example.com/key")
    assert dns.calls == [
        "data.example.com",
        "data.s3.us-east-1.example.com",
        "other.example.com",
    ]


def test_a_named_endpoint_may_be_private_but_must_resolve(tmp_path: Path) -> None:
    store = open_store(
        user_store("http://minio.internal:9000", ("minio.internal:9000",)), resolve=fake_resolve
    )
    assert isinstance(store, S3ObjectStore)
    pool = store.client._http.connection_from_url("http://minio.internal:9000/data")
    assert (pool.host, pool.port) == ("10.1.2.3", 9000)
    with pytest.raises(StoreConfigError, match=re.escape("'gone.internal' does not resolve")):
        open_store(
            user_store("http://gone.internal:9000", ("gone.internal",)), resolve=fake_resolve
        )


@pytest.mark.parametrize(
    ("url", "allowed", "words"),
    [
        ("http://10.0.0.5:9000", (), "not an allowed data endpoint"),  # no entry any more
        ("http://10.0.0.5:9000", ("10.0.0.5:9001",), "not an allowed data endpoint"),
        ("http://10.0.0.5:9000", ("ftp://x",), "ftp://x"),
        ("http://evil.example.com", ("*.example.com",), "169.254.169.254 (link-local)"),
    ],
)
def test_what_the_learner_refuses(url: str, allowed: tuple[str, ...], words: str) -> None:
    with pytest.raises(StoreConfigError) as refused:
        open_store(user_store(url, allowed), resolve=fake_resolve)
    assert str(refused.value).startswith(f"the S3 endpoint {url} is refused: ")
    assert words in str(refused.value)


def test_the_platform_store_is_not_checked() -> None:
    resolve = Rebinding("10.0.0.5")
    store = open_store(user_store("http://10.9.9.9:9000", None), resolve=resolve)
    assert isinstance(store, S3ObjectStore) and resolve.calls == []


def test_the_entries_travel_in_the_learner_spec(tmp_path: Path) -> None:
    p = policy(
        tmp_path,
        **CLUSTER,
        allowed_data_endpoints="*.example.com, https://s3.example.com, [fd00::1]:9000, *",
    )
    assert p.entries_for("https://s3.example.com") == (
        "*.example.com",
        "https://s3.example.com:443",
        "*",
    )
    assert p.entries_for("http://[fd00::1]:9000") == ("[fd00::1]:9000", "*")
    assert p.entries_for("http://minio:9000") == ("http://minio:9000", "*")
    assert p.entries_for("ftp://minio") == ()
    for entry in p.entries:
        assert EndpointPolicy.of([str(entry)]).entries == (entry,)
    location = BucketLocation(store=user_store("https://s3.example.com", ("*.example.com",)))
    data = json.loads(json.dumps(dataclasses.asdict(location), default=str))
    assert data["store"]["allowed_endpoints"] == ["*.example.com"]
    assert BucketLocation.from_dict(data, "spec.training_data").store.allowed_endpoints == (
        "*.example.com",
    )
    data["store"]["allowed_endpoints"] = [1]
    with pytest.raises(SpecError, match="allowed_endpoints"):
        BucketLocation.from_dict(data, "spec.training_data")


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
