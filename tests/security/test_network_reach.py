"""Attack: a tenant's learner pod reaching what is not its own training on the network (another
tenant's learners and their unauthenticated gRPC, the cloud metadata address, the
platform's API, database and Redis), or another training reaching it.

No cluster enforces policies here, so the NetworkPolicies the chart and the backend make
are evaluated as the API defines them: a pod selected by a policy of a type (Ingress,
Egress) is allowed, in that direction, only what the union of those policies' rules
allows; a connection needs both the source's egress and the destination's ingress."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import pytest

from service.domain.egress import EgressRules, PodPeer
from tests.deploy.chart import NAMESPACE, RELEASE, objects
from tests.deploy.test_chart_network import matches, workload_labels
from tests.unit.test_k8s_objects import CPU, Case, of_kind
from worker.backends.kubernetes.network import training_network_policy
from worker.backends.kubernetes.objects import ClusterConfig

CLUSTER = ClusterConfig(
    namespace=NAMESPACE,
    image_prefix="dlaas/",
    image_tag="1.0",
    pull_secrets=(),
    gpu_resource="nvidia.com/gpu",
    cluster_domain="cluster.local",
)


@dataclass(frozen=True)
class Endpoint:
    ip: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None  # None: not a pod (an address outside the cluster)
    namespace_labels: dict[str, str] = field(default_factory=dict)


def _peer_matches(peer: dict[str, Any], other: Endpoint, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        address = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(e) for e in block.get("except", []))
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not matches(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or matches(peer["podSelector"], other.labels)


def _allowed(
    policies: list[dict[str, Any]], pod: Endpoint, other: Endpoint, port: int, direction: str
) -> bool:
    """Whether `pod`'s policies of `direction` allow its traffic with `other` on `port`."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if direction in p["spec"]["policyTypes"]
        and pod.namespace == p["metadata"].get("namespace", NAMESPACE)
        and matches(p["spec"]["podSelector"], pod.labels)
    ]
    if not selecting:
        return True  # a pod no policy of that type selects is not isolated
    for policy in selecting:
        for rule in policy["spec"].get(key, []):
            ports = rule.get("ports")
            if ports is not None and not any(p.get("port") == port for p in ports):
                continue
            peers = rule.get(peers_key)
            namespace = policy["metadata"].get("namespace", NAMESPACE)
            if peers is None or any(_peer_matches(p, other, namespace) for p in peers):
                return True
    return False


def connects(policies: list[dict[str, Any]], source: Endpoint, dest: Endpoint, port: int) -> bool:
    egress_ok = source.namespace is None or _allowed(policies, source, dest, port, "Egress")
    ingress_ok = dest.namespace is None or _allowed(policies, dest, source, port, "Ingress")
    return egress_ok and ingress_ok


NS_LABELS = {"kubernetes.io/metadata.name": NAMESPACE}
ALICE = Case("tensorflow", 2, CPU, tenant="alice", training_id="alice00000001")
BOB = Case("tensorflow", 2, CPU, tenant="bob", training_id="bob000000001")
# A wide egress, as for a public S3, with the cluster's ranges denied.
EGRESS = EgressRules(
    cidrs=("0.0.0.0/0",),
    pods=(
        PodPeer(
            (("app.kubernetes.io/instance", RELEASE), ("app.kubernetes.io/component", "redis"))
        ),
    ),
    ports=(443, 6379),
    denied=("10.0.0.0/8",),
)


def learner(case: Case, i: int) -> Endpoint:
    pod = of_kind(case.objects(CLUSTER), "Pod")[i]
    subnet = 1 if case is ALICE else 2
    return Endpoint(f"10.244.{subnet}.{i + 1}", pod["metadata"]["labels"], NAMESPACE, NS_LABELS)


@pytest.fixture(scope="module")
def world() -> tuple[list[dict[str, Any]], dict[str, Endpoint]]:
    chart = objects()
    policies = [o for o in chart if o["kind"] == "NetworkPolicy"]
    for o in policies:
        o["metadata"]["namespace"] = NAMESPACE
    policies += [training_network_policy(c.inputs(), CLUSTER, EGRESS) for c in (ALICE, BOB)]
    pods = {
        c: Endpoint(f"10.244.9.{n}", labels, NAMESPACE, NS_LABELS)
        for n, (c, labels) in enumerate(sorted(workload_labels(chart).items()), start=1)
    }
    pods["kube-dns"] = Endpoint(
        "10.244.0.10",
        {"k8s-app": "kube-dns"},
        "kube-system",
        {"kubernetes.io/metadata.name": "kube-system"},
    )
    pods["other-namespace"] = Endpoint(
        "10.244.8.1", {"app": "x"}, "elsewhere", {"kubernetes.io/metadata.name": "elsewhere"}
    )
    return policies, pods


def test_a_learner_reaches_its_own_training_dns_and_the_configured_egress(
    world: tuple[list[dict[str, Any]], dict[str, Endpoint]],
) -> None:
    policies, pods = world
    a1, a2 = learner(ALICE, 0), learner(ALICE, 1)
    assert connects(policies, a1, a2, 2222) and connects(policies, a2, a1, 2222)
    assert connects(policies, a1, pods["kube-dns"], 53)
    assert connects(policies, a1, pods["redis"], 6379)
    assert connects(policies, a1, Endpoint("52.216.8.1"), 443)  # a public S3 address


@pytest.mark.parametrize(
    ("target", "port"),
    [
        ("api", 8080),
        ("postgresql", 5432),
        ("minio", 9000),  # not in this training's egress (an external store is)
        ("worker", 8080),
        ("monitor", 8080),
        ("other-namespace", 80),
        ("redis", 22),  # the allowed pod, on a port not allowed
        ("kube-dns", 8080),
    ],
)
def test_a_learner_reaches_no_platform_component_nor_other_namespace(
    world: tuple[list[dict[str, Any]], dict[str, Endpoint]], target: str, port: int
) -> None:
    policies, pods = world
    assert not connects(policies, learner(ALICE, 0), pods[target], port)


@pytest.mark.parametrize("address", ["169.254.169.254", "10.96.0.1", "10.244.9.1"])
@pytest.mark.parametrize("port", [80, 443])
def test_the_metadata_address_and_the_clusters_ranges_are_out_of_reach(
    world: tuple[list[dict[str, Any]], dict[str, Endpoint]], address: str, port: int
) -> None:
    policies, _ = world
    assert not connects(policies, learner(ALICE, 0), Endpoint(address), port)


def test_trainings_cannot_reach_each_other_in_either_direction(
    world: tuple[list[dict[str, Any]], dict[str, Endpoint]],
) -> None:
    policies, _ = world
    for mine, theirs in ((ALICE, BOB), (BOB, ALICE)):
        for port in (2222, 2022, 22, 80):
            assert not connects(policies, learner(mine, 0), learner(theirs, 1), port)


def test_the_platform_cannot_dial_into_a_learner_nor_a_learner_into_the_api(
    world: tuple[list[dict[str, Any]], dict[str, Endpoint]],
) -> None:
    policies, pods = world
    for component in ("api", "worker", "monitor", "redis"):
        assert not connects(policies, pods[component], learner(ALICE, 0), 2222), component
    # The API itself stays reachable from outside (its Ingress or load balancer).
    assert connects(policies, Endpoint("203.0.113.5"), pods["api"], 8080)
    assert not connects(policies, Endpoint("203.0.113.5"), pods["postgresql"], 5432)


def test_without_the_chart_policies_the_training_policy_alone_still_isolates() -> None:
    """The backend's policy does not depend on the chart's default-deny being there."""
    policies = [training_network_policy(c.inputs(), CLUSTER, EgressRules()) for c in (ALICE, BOB)]
    a1, b1 = learner(ALICE, 0), learner(BOB, 0)
    assert not connects(policies, a1, b1, 2222)
    assert not connects(policies, b1, a1, 2222)
    assert not connects(policies, a1, Endpoint("169.254.169.254"), 80)
    assert not connects(policies, a1, Endpoint("52.216.8.1"), 443)  # no egress configured
    assert connects(policies, a1, learner(ALICE, 1), 2222)


@pytest.mark.parametrize("port", [80, 443, 8775])
def test_an_egress_to_anywhere_on_any_port_still_excepts_the_metadata_address(port: int) -> None:
    egress = EgressRules(cidrs=("0.0.0.0/0", "::/0"))
    policies = [training_network_policy(ALICE.inputs(), CLUSTER, egress)]
    a1 = learner(ALICE, 0)
    assert connects(policies, a1, Endpoint("52.216.8.1"), port)
    assert not connects(policies, a1, Endpoint("169.254.169.254"), port)
    assert not connects(policies, a1, Endpoint("fd00:ec2::254"), port)
    assert connects(policies, a1, Endpoint("2600:1f18::1"), port)
