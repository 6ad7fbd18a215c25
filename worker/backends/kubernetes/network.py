"""A training's NetworkPolicy, as a plain dict (the API's JSON). Pure: no client, no cluster.

The policy selects exactly the training's pods (the label its headless Service selects
by) and allows:
- ingress only from the same training's pods (any port: gRPC between TensorFlow's tasks,
  ssh and Open MPI's TCP transport between MPI ranks, torchrun's rendezvous on 29400 and
  the Gloo or NCCL connections between PyTorch's processes);
- egress only to the same training's pods, to the cluster's DNS (kube-dns/CoreDNS, pods
  labelled `k8s-app=kube-dns` in `kube-system`, UDP and TCP 53), and to the store and log
  endpoints the operator lists (`EgressRules`: ipBlocks, pod selectors, on the listed TCP
  ports). Nothing else: the cloud metadata address is an `except` of every ipBlock that
  contains it, as is every range the operator denies (the cluster's pod and Service ranges:
  the platform's own Services), and a rule with no peer (which would mean "anywhere") is
  never written.
A cluster enforces it only with a network plugin that implements NetworkPolicy (Calico,
Cilium, ...); the chart adds a default-deny policy for every learner pod besides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from service.domain.egress import METADATA_CIDRS, NAMESPACE_NAME_LABEL, EgressRules, network
from service.domain.names import label_value
from worker.backends.kubernetes.objects import (
    TRAINING_LABEL,
    ClusterConfig,
    TrainingObjectsInput,
    object_metadata,
)

# The cluster's DNS: kube-dns and CoreDNS both run as `k8s-app=kube-dns` in kube-system.
DNS_NAMESPACE = "kube-system"
DNS_POD_LABELS = {"k8s-app": "kube-dns"}
DNS_PORT = 53


def policy_name(prefix: str) -> str:
    return f"{prefix}-network"


def ip_block(cidr: str, denied: Iterable[str]) -> dict[str, Any]:
    """An ipBlock of `cidr` with every denied range (and the metadata address) that lies
    strictly inside it as an `except` (the API refuses one that does not)."""
    allowed = network(cidr, "egress CIDR")
    excepted = []
    for text in (*METADATA_CIDRS, *denied):
        d = network(text, "denied range")
        if d.version == allowed.version and d != allowed and d.subnet_of(allowed):  # type: ignore[arg-type]
            excepted.append(str(d))
    block: dict[str, Any] = {"cidr": str(allowed)}
    if excepted:
        block["except"] = sorted(set(excepted), key=excepted.index)
    return block


def training_network_policy(
    inp: TrainingObjectsInput, cluster: ClusterConfig, egress: EgressRules
) -> dict[str, Any]:
    """The training's NetworkPolicy, owned by `inp.owner` like its other objects."""
    own = {"podSelector": {"matchLabels": {TRAINING_LABEL: label_value(inp.training_id)}}}
    dns = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: DNS_NAMESPACE}},
        "podSelector": {"matchLabels": dict(DNS_POD_LABELS)},
    }
    egress_rules: list[dict[str, Any]] = [
        {"to": [own]},
        {
            "to": [dns],
            "ports": [
                {"protocol": "UDP", "port": DNS_PORT},
                {"protocol": "TCP", "port": DNS_PORT},
            ],
        },
    ]
    endpoints = [{"ipBlock": ip_block(c, egress.denied)} for c in egress.cidrs]
    endpoints += [p.peer() for p in egress.pods]
    if endpoints:  # never a rule without peers: that would allow every destination
        rule: dict[str, Any] = {"to": endpoints}
        if egress.ports:
            rule["ports"] = [{"protocol": "TCP", "port": p} for p in egress.ports]
        egress_rules.append(rule)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_metadata(policy_name(inp.prefix), inp, cluster),
        "spec": {
            "podSelector": own["podSelector"],
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [own]}],
            "egress": egress_rules,
        },
    }
