"""Which S3 endpoints users may point the platform at (an SSRF guard): checked at
submission, and again by the learner that connects, pinned to the address it checked.

Learners connect to the `endpoint_url` of a manifest's data and results references from
inside the platform's network, so an arbitrary URL would let a user reach internal
services (cloud metadata at 169.254.169.254, databases, the cluster API). Only endpoints on
an allowlist are accepted (DLAAS_ALLOWED_DATA_ENDPOINTS), each entry one of

- `host` or `host:port` (`[v6]:port`), `scheme://host[:port]`: exactly that endpoint, named
  by the operator, so it may be a private address;
- `*.example.com` (any subdomain) or `*` (any host): host names that must resolve to
  public addresses only; private, loopback, link-local and reserved addresses are refused.
  An IPv6 address that carries an IPv4 one (IPv4-mapped or -compatible, NAT64
  64:ff9b::/96, 6to4, Teredo) is what that IPv4 address is.

The default list is the platform's own S3 endpoint only, on one machine as in a cluster;
the platform's own endpoint is always allowed, and setting the list replaces the rest.

A name checked at submission may resolve elsewhere when a learner connects (DNS
rebinding), so the worker hands each learner the entries that allowed its endpoint
(StoreConfig.allowed_endpoints) and opening the store checks again (`EndpointPolicy.pin`):
the host is resolved once, every address is checked, and the client connects to that
address and no other (service.storage.s3).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from service.errors import FieldError
from service.storage.s3 import check_user_bucket_name, parse_endpoint

if TYPE_CHECKING:  # not at run time: learners import this module and must start fast
    from service.domain.manifest import Manifest
    from service.settings import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[IPAddress]]
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d (deprecated, RFC 4291)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


class EndpointRefused(ValueError):
    """An endpoint, or an address it resolves to, that the policy does not allow; the
    message says which and why."""


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


def carried_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (and reaches): IPv4-mapped
    `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4
    `2002:AABB:CCDD::/48`, Teredo `2001::/32` (its server and client); empty for others."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    return []


def address_kind(address: IPAddress) -> str:
    """What `address` is: "public", or else "unspecified", "loopback", "link-local",
    "multicast", "private" or "reserved". An IPv6 address that carries IPv4 ones
    (carried_ipv4) is what they are: the first of them that is not public, if any."""
    if isinstance(address, ipaddress.IPv6Address) and (carried := carried_ipv4(address)):
        kinds = [address_kind(a) for a in carried]
        return next((k for k in kinds if k != "public"), "public")
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local):
        return "private"
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST:
        return "reserved"  # outside 2000::/3 nothing is routed on the internet
    if not address.is_global or address.is_reserved:
        return "reserved"
    return "public"


def _described(addresses: Iterable[IPAddress]) -> str:
    return ", ".join(f"{a} ({address_kind(a)})" for a in sorted(set(addresses), key=str))


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

    def __str__(self) -> str:
        """The entry as DLAAS_ALLOWED_DATA_ENDPOINTS writes it (parse(str(e)) == e)."""
        text = f"[{self.host}]" if ":" in self.host else self.host
        if self.port is not None:
            text += f":{self.port}"
        return f"{self.scheme}://{text}" if self.scheme else text

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
class _Target:
    """An endpoint URL the policy allows: named exactly by an entry (any address), or only
    by a wildcard (public addresses only)."""

    url: str  # scheme://host[:port]
    host: str  # normalized
    port: int
    named: bool


@dataclass(frozen=True)
class EndpointPolicy:
    entries: tuple[_Entry, ...]
    resolve: Resolver = field(default=resolve_host, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings, resolve: Resolver = resolve_host) -> EndpointPolicy:
        """The platform's own S3 endpoint (if it has one) and DLAAS_ALLOWED_DATA_ENDPOINTS.
        Raises ValueError for an entry that is not one."""
        entries: list[str] = []
        if settings.s3_endpoint:
            entries.append(settings.s3_endpoint)
        if settings.allowed_data_endpoints is not None:
            entries += settings.allowed_data_endpoints.split(",")
        return cls.of(entries, resolve)

    @classmethod
    def of(cls, entries: Iterable[str], resolve: Resolver = resolve_host) -> EndpointPolicy:
        """A policy of these entries (as DLAAS_ALLOWED_DATA_ENDPOINTS writes them; blank
        ones are skipped). Raises ValueError for an entry that is not one."""
        return cls(tuple(_Entry.parse(e) for e in entries if e.strip()), resolve)

    def entries_for(self, url: str) -> tuple[str, ...]:
        """The entries that allow `url`, as text: all a learner needs to check it again
        (EndpointPolicy.of(them).pin(url)). Empty if none does."""
        try:
            parse_endpoint(url)
        except ValueError:
            return ()
        parts = urlsplit(url.strip())
        host = _normal_host(parts.hostname or "")
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        return tuple(str(e) for e in self.entries if e.matches(parts.scheme, host, port))

    def _target(self, url: str) -> _Target:
        try:
            parse_endpoint(url)
        except ValueError as e:
            raise EndpointRefused(str(e)) from e
        parts = urlsplit(url.strip())
        scheme = parts.scheme
        host = _normal_host(parts.hostname or "")
        port = parts.port or _DEFAULT_PORTS[scheme]
        matching = [e for e in self.entries if e.matches(scheme, host, port)]
        if not matching:
            raise EndpointRefused(
                f"{scheme}://{parts.netloc} is not an allowed data endpoint on this platform "
                "(the operator lists them in DLAAS_ALLOWED_DATA_ENDPOINTS)"
            )
        named = any(not e.wildcard for e in matching)
        return _Target(f"{scheme}://{parts.netloc}", host, port, named)

    def checked_addresses(self, host: str, port: int, *, public_only: bool) -> list[IPAddress]:
        """What `host` resolves to, now, every address checked."""
        addresses = list(self.resolve(host, port))
        if not addresses:
            raise EndpointRefused(f"the host {host!r} does not resolve")
        if public_only:
            private = [a for a in addresses if address_kind(a) != "public"]
            if private:
                raise EndpointRefused(
                    f"the host {host!r} resolves to {_described(private)}; only endpoints "
                    "the operator names may be private"
                )
        return addresses

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be used as a data or results endpoint; None if it may. An
        endpoint an entry names is not resolved (the operator vouches for it); one allowed
        by a wildcard only must resolve to public addresses only."""
        try:
            target = self._target(url)
            if not target.named:
                self.checked_addresses(target.host, target.port, public_only=True)
        except EndpointRefused as e:
            return str(e)
        return None

    def pin(self, url: str) -> AddressPins:
        """Check `url` again, now, to connect to it: resolve its host once, check every
        address (as `refusal` does, and a named endpoint must resolve too), and return the
        pins its client connects through. Raises EndpointRefused."""
        target = self._target(url)
        addresses = self.checked_addresses(target.host, target.port, public_only=not target.named)
        return AddressPins(self, target, str(addresses[0]))


class AddressPins:
    """Where one S3 client may connect (see service.storage.s3): its endpoint's host at the
    address checked when the store was opened, and any other host the client names (AWS's
    virtual-host and regional names for a bucket) at the address it resolved to the first
    time, which must be public. Each host is resolved once, so what was checked is what
    is connected to."""

    def __init__(self, policy: EndpointPolicy, target: _Target, address: str) -> None:
        self._policy = policy
        self.endpoint = target.url
        self._pins = {(target.host, target.port): address}
        self._lock = threading.Lock()

    def address(self, host: str, port: int) -> str:
        """The address to connect to for `host`:`port`; raises EndpointRefused (naming the
        endpoint and the address) if it is not public."""
        key = (_normal_host(host), port)
        with self._lock:
            pinned = self._pins.get(key)
            if pinned is None:
                try:
                    addresses = self._policy.checked_addresses(*key, public_only=True)
                except EndpointRefused as e:
                    raise EndpointRefused(f"the S3 endpoint {self.endpoint} is refused: {e}") from e
                pinned = self._pins[key] = str(addresses[0])
            return pinned


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
        bad_bucket = check_user_bucket_name(bucket)
        if bad_bucket is not None:
            where = "source" if pointer.endswith("data_reference") else "target"
            errors.append(FieldError(f"{pointer}/{where}/bucket", bad_bucket))
    if data is not None and ".." in data.source.prefix.split("/"):
        errors.append(FieldError("/training_data_reference/source/prefix", "must not contain '..'"))
    return errors
