"""Users' S3 endpoints against real servers: the client follows no redirect, and a user's
bucket is reached at the address checked for it, the name kept for Host, SNI and the
certificate."""

from __future__ import annotations

import datetime
import io
import ipaddress
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from service.domain.records import Secret
from service.storage import open_store
from service.storage.base import StoreUnavailable
from service.storage.config import StoreConfig
from service.storage.endpoints import IPAddress
from service.storage.s3 import S3ObjectStore
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, moto_server, stub_server

pytestmark = pytest.mark.integration

METADATA = "http://169.254.169.254/latest/meta-data/"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        server.make_bucket("pinned", {"train/a.txt": b"alpha"})
        yield server


def user_config(endpoint: str, allowed: tuple[str, ...] | None) -> StoreConfig:
    return StoreConfig(
        kind="s3",
        endpoint=endpoint,
        access_key=Secret(ACCESS_KEY),
        secret_key=Secret(SECRET_KEY),
        bucket="pinned",
        allowed_endpoints=allowed,
    )


class Dns:
    """Resolves every name to `first`, then to `later` (a rebinding name)."""

    def __init__(self, first: str, later: str = "10.255.255.1") -> None:
        self.answers = [ipaddress.ip_address(first), ipaddress.ip_address(later)]
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> Sequence[IPAddress]:
        self.calls.append((host, port))
        return [self.answers[min(len(self.calls), 2) - 1]]


def operations(store: S3ObjectStore) -> dict[str, Callable[[], object]]:
    return {
        "check_bucket": store.check_bucket,
        "list": lambda: list(store.list("train")),
        "open": lambda: store.open("train/a.txt").read(),
        "stat": lambda: store.stat("train/a.txt"),
        "put_stream": lambda: store.put_stream("out/b.txt", io.BytesIO(b"beta"), 4),
    }


# -- redirects -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("user", [False, True], ids=["platform-store", "user-bucket"])
def test_a_redirect_is_not_followed_and_names_the_endpoint(status: int, user: bool) -> None:
    with stub_server() as target, stub_server(status, f"{target.url}/latest/meta-data/") as r:
        if user:
            store = open_store(user_config(r.url, ("127.0.0.1",)))
        else:
            store = S3ObjectStore(r.url, "pinned", access_key=ACCESS_KEY, secret_key=SECRET_KEY)
        assert isinstance(store, S3ObjectStore)
        for name, operation in operations(store).items():
            with pytest.raises(StoreUnavailable) as failed:
                operation()
            assert str(failed.value) == (
                f"the S3 store at {r.url} (bucket 'pinned') answered {status} redirecting to "
                f"'{target.url}/latest/meta-data/'; the platform follows no redirects from S3 "
                "endpoints"
            ), name
        assert len(r.requests) == len(operations(store))  # each asked once, not retried
        assert target.requests == []  # and nothing followed to the target


def test_a_redirect_to_the_metadata_address_is_not_followed() -> None:
    with stub_server(307, METADATA) as redirector:
        store = open_store(user_config(redirector.url, ("127.0.0.1",)))
        assert isinstance(store, S3ObjectStore)
        with pytest.raises(StoreUnavailable) as e:
            list(store.list("train"))
        assert str(e.value).startswith(f"the S3 store at {redirector.url} (bucket 'pinned') ")
        assert f"answered 307 redirecting to '{METADATA}'" in str(e.value)


# -- pinning ---------------------------------------------------------------------------------


def test_a_user_bucket_is_reached_at_the_address_checked(s3: S3Server) -> None:
    """A name no DNS knows, resolved once (then it would rebind to an unroutable address):
    every request goes to the address checked, with the name as Host."""
    port = int(s3.netloc.rsplit(":", 1)[1])
    endpoint = f"http://s3-pinned:{port}"  # one label: moto takes the bucket from the path
    dns = Dns("127.0.0.1")
    store = open_store(user_config(endpoint, ("s3-pinned",)), resolve=dns)
    assert isinstance(store, S3ObjectStore)
    store.check_bucket()
    assert [o.key for o in store.list("train")] == ["train/a.txt"]
    with store.open("train/a.txt") as f:
        assert f.read() == b"alpha"
    store.put_stream("out/b.txt", io.BytesIO(b"beta"), 4)
    assert s3.objects("pinned", "out/") == {"out/b.txt": b"beta"}
    assert dns.calls == [("s3-pinned", port)]

    with stub_server(200) as stub:
        name = f"data.pinned.test:{stub.url.rsplit(':', 1)[1]}"
        store = open_store(
            user_config(f"http://{name}", ("data.pinned.test",)), resolve=Dns("127.0.0.1")
        )
        assert isinstance(store, S3ObjectStore)
        store.check_bucket()
        store.check_bucket()
        assert stub.requests == [("HEAD", "/pinned", name)] * 2


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_user_bucket_is_pinned_to_an_ipv6_address() -> None:
    with stub_server(200, host="::1") as stub:
        port = int(stub.url.rsplit(":", 1)[1])
        store = open_store(
            user_config(f"http://v6.pinned.test:{port}", ("v6.pinned.test",)), resolve=Dns("::1")
        )
        assert isinstance(store, S3ObjectStore)
        store.check_bucket()
        assert stub.requests == [("HEAD", "/pinned", f"v6.pinned.test:{port}")]


def _certificate(tmp_path: Path, name: str) -> tuple[str, str]:
    """A self-signed certificate for `name` (its own CA), and its key: file paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


def test_an_https_bucket_is_pinned_keeping_the_name_for_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connected to the checked address, the client still asks for the name (SNI) and
    verifies the certificate against it: a certificate for the name passes (and its
    endpoint's redirect is refused), none other does."""
    tls = _certificate(tmp_path, "s3.pinned.test")
    monkeypatch.setenv("SSL_CERT_FILE", tls[0])  # the client's default trust: this CA only
    with stub_server(307, METADATA, tls=tls) as stub:
        port = int(stub.url.rsplit(":", 1)[1])
        for name in ("s3.pinned.test", "other.pinned.test"):
            endpoint = f"https://{name}:{port}"
            store = open_store(user_config(endpoint, (name,)), resolve=Dns("127.0.0.1"))
            assert isinstance(store, S3ObjectStore)
            with pytest.raises(StoreUnavailable) as e:
                store.check_bucket()
            assert str(e.value).startswith(f"the S3 store at {endpoint} (bucket 'pinned') ")
            if name == "s3.pinned.test":
                assert "answered 307 redirecting to" in str(e.value)
            else:
                assert "is unreachable: " in str(e.value)  # the certificate is not its
        assert stub.server_names[0] == "s3.pinned.test"
        assert set(stub.server_names[1:]) == {"other.pinned.test"}  # (retried)
        assert [host for _, _, host in stub.requests] == [f"s3.pinned.test:{port}"]
