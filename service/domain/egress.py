"""Where a training's pods may connect besides their own training and DNS (the egress of
its Kubernetes NetworkPolicy, worker/backends/kubernetes/network.py): the operator's
settings DLAAS_K8S_EGRESS_CIDRS, DLAAS_K8S_EGRESS_PODS, DLAAS_K8S_EGRESS_PORTS and
DLAAS_K8S_EGRESS_DENIED_CIDRS, parsed and checked. Pure."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from service.domain.names import is_dns_label, is_label_key, is_label_value

# The instance metadata address of the clouds (AWS, GCP, Azure, OpenStack; AWS's IPv6
# one): its credentials are the node's, never a tenant's.
METADATA_CIDRS = ("169.254.169.254/32", "fd00:ec2::254/128")
# The label every namespace carries with its own name (Kubernetes 1.22+).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PodPeer:
    """Pods the learners may reach: those with all of `labels`, in `namespace` (None: the
    training's own)."""

    labels: tuple[tuple[str, str], ...]
    namespace: str | None = None

    def peer(self) -> dict[str, Any]:
        peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(self.labels)}}
        if self.namespace is not None:
            peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: self.namespace}}
        return peer


@dataclass(frozen=True)
class EgressRules:
    """Where, besides their own training and DNS, the learners' pods may connect: the
    store's and the log store's addresses (`cidrs`, `pods`), on `ports` (TCP; empty: any
    port), never inside `denied` (nor the metadata address)."""

    cidrs: tuple[str, ...] = ()
    pods: tuple[PodPeer, ...] = ()
    ports: tuple[int, ...] = ()
    denied: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        denied = [network(c, "denied range") for c in (*METADATA_CIDRS, *self.denied)]
        for text in self.cidrs:
            allowed = network(text, "egress CIDR")
            for d in denied:
                if allowed.version == d.version and allowed.subnet_of(d):  # type: ignore[arg-type]
                    raise ValueError(f"the egress CIDR {text} lies inside the denied range {d}")
        for port in self.ports:
            if not 1 <= port <= 65535:
                raise ValueError(f"the egress port {port} is not between 1 and 65535")


def network(text: str, what: str) -> Network:
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as e:
        raise ValueError(f"the {what} '{text}' is not a CIDR ({e})") from None


def parse_cidrs(text: str, what: str = "egress CIDR") -> tuple[str, ...]:
    """Comma-separated CIDRs (blanks dropped), each checked, in their normal form."""
    return tuple(str(network(c, what)) for c in text.split(",") if c.strip())


def parse_ports(text: str) -> tuple[int, ...]:
    """Comma-separated TCP ports (blanks and repeats dropped)."""
    ports = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= 65535:
            raise ValueError(f"the egress port '{part}' is not a port number (1 to 65535)")
        ports.append(int(part))
    return tuple(dict.fromkeys(ports))


def parse_pod_peers(text: str) -> tuple[PodPeer, ...]:
    """`;`-separated `[NAMESPACE:]KEY=VALUE[,KEY=VALUE...]` entries (blanks dropped)."""
    peers = []
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        namespace, _, selector = entry.rpartition(":")
        if namespace and not is_dns_label(namespace):
            raise ValueError(f"'{namespace}' in the egress pods '{entry}' is not a namespace")
        labels = []
        for pair in (p.strip() for p in selector.split(",")):
            key, eq, value = pair.partition("=")
            if not eq or not is_label_key(key.strip()) or not is_label_value(value.strip()):
                raise ValueError(
                    f"'{pair}' in the egress pods '{entry}' is not KEY=VALUE with a label "
                    "key and value"
                )
            labels.append((key.strip(), value.strip()))
        peers.append(PodPeer(tuple(labels), namespace or None))
    return tuple(peers)
