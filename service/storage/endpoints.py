"""Which S3 endpoints users may point the platform at (an SSRF guard), checked at submission.

Learners connect to the `endpoint_url` of a manifest's data and results references from
inside the platform's network, so an arbitrary URL would let a user reach internal
services (cloud metadata at 169.254.169.254, databases, the cluster API). Only endpoints on
an allowlist are accepted (DLAAS_ALLOWED_DATA_ENDPOINTS), each entry one of

- `host` or `host:port` (`[v6]:port`), `scheme://host[:port]`: exactly that endpoint, named
  by the operator, so it may be a private address;
- `*.example.com` (any subdomain) or `*` (any host): host names that must resolve to
  public addresses only; private, loopback, link-local and reserved addresses are refused.

The default list is the platform's own S3 endpoint, plus loopback when the platform runs
on one machine (`dlaas up`: an SQLite database, or objects in the local directory), where
users keep their MinIO beside it. The platform's own endpoint is always allowed; setting
the list replaces the rest of the default.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from service.domain.manifest import Manifest
from service.errors import FieldError
from service.settings import Settings
from service.storage.s3 import check_bucket_name, parse_endpoint

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[IPAddress]]
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (empty if it does not)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def _normal_host(host: str) -> str:
    host = host.strip().strip("[]").lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class _Entry:
    host: str  # normalized; "*" any; "*.suffix"
    port: int | None = None  # None: any port
    scheme: str | None = None  # None: either

    @classmethod
    def parse(cls, text: str) -> _Entry:
        text = text.strip()
        if text == "*" or text.startswith("*."):
            return cls(_normal_host(text) if text != "*" else "*")
        if "://" in text:
            parts = urlsplit(text)
            if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
                raise ValueError(f"allowed data endpoint {text!r} is not scheme://host[:port]")
            port = parts.port or _DEFAULT_PORTS[parts.scheme]
            return cls(_normal_host(parts.hostname), port, parts.scheme)
        parts = urlsplit(f"//{text}")
        if not parts.hostname:
            raise ValueError(f"allowed data endpoint {text!r} is not host[:port]")
        return cls(_normal_host(parts.hostname), parts.port)

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*")

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if self.scheme is not None and self.scheme != scheme:
            return False
        if self.port is not None and self.port != port:
            return False
        if self.host == "*":
            return True
        if self.wildcard:
            return host.endswith(self.host[1:])
        return host == self.host


@dataclass(frozen=True)
class EndpointPolicy:
    entries: tuple[_Entry, ...]
    allow_loopback: bool = False
    resolve: Resolver = field(default=resolve_host, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings, resolve: Resolver = resolve_host) -> EndpointPolicy:
        entries: list[_Entry] = []
        if settings.s3_endpoint:
            entries.append(_Entry.parse(settings.s3_endpoint))
        configured = settings.allowed_data_endpoints
        if configured is not None:
            entries += [_Entry.parse(e) for e in configured.split(",") if e.strip()]
        # One machine (an SQLite database, or objects in the local directory): loopback is
        # the user's own machine. A cluster has neither, and loopback there is internal.
        one_machine = settings.resolved_database_url.startswith("sqlite") or not (
            settings.s3_endpoint
        )
        return cls(tuple(entries), configured is None and one_machine, resolve)

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be used as a data or results endpoint; None if it may."""
        try:
            parse_endpoint(url)
        except ValueError as e:
            return str(e)
        parts = urlsplit(url.strip())
        scheme = parts.scheme
        host = _normal_host(parts.hostname or "")
        port = parts.port or _DEFAULT_PORTS[scheme]
        if self.allow_loopback and _is_loopback(host):
            return None
        wildcard = False
        for entry in self.entries:
            if entry.matches(scheme, host, port):
                if not entry.wildcard:
                    return None
                wildcard = True
        if not wildcard:
            return (
                f"{scheme}://{parts.netloc} is not an allowed data endpoint on this platform "
                "(the operator lists them in DLAAS_ALLOWED_DATA_ENDPOINTS)"
            )
        addresses = self.resolve(host, port)
        if not addresses:
            return f"the host {host!r} does not resolve"
        private = [str(a) for a in addresses if not _is_public(a)]
        if private:
            return (
                f"the host {host!r} resolves to a private or reserved address "
                f"({', '.join(sorted(set(private)))}); only named endpoints may be private"
            )
        return None


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_references(manifest: Manifest, policy: EndpointPolicy) -> list[FieldError]:
    """Field errors for the manifest's data and results references (endpoint allowed,
    bucket names valid); empty if both are acceptable."""
    errors: list[FieldError] = []
    data = manifest.training_data_reference
    results = manifest.training_results_reference
    refs = [
        ("/training_data_reference", data, data.source.bucket if data else ""),
        ("/training_results_reference", results, results.target.bucket if results else ""),
    ]
    for pointer, ref, bucket in refs:
        if ref is None:
            continue
        why = policy.refusal(ref.connection.endpoint_url)
        if why is not None:
            errors.append(FieldError(f"{pointer}/connection/endpoint_url", why))
        bad_bucket = check_bucket_name(bucket)
        if bad_bucket is not None:
            where = "source" if pointer.endswith("data_reference") else "target"
            errors.append(FieldError(f"{pointer}/{where}/bucket", bad_bucket))
    if data is not None and ".." in data.source.prefix.split("/"):
        errors.append(FieldError("/training_data_reference/source/prefix", "must not contain '..'"))
    return errors
