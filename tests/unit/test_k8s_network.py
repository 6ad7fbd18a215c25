"""A training's NetworkPolicy (worker/backends/kubernetes/network.py) and the hardening of
its pods, table-tested without a cluster: the policy selects exactly the training's pods
and allows exactly its own pods, DNS and the configured egress (the metadata address and
the denied ranges excepted); every object validates strictly against the API's schemas;
every container runs as a non-root uid with RuntimeDefault seccomp, no capability, no
privilege escalation and nothing writable but its volumes."""

from __future__ import annotations

import copy
import os
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from composition.backend import kubernetes_network_problems
from service.domain.egress import EgressRules, PodPeer, parse_pod_peers, parse_ports
from service.settings import Settings
from tests.unit.test_k8s_objects import CASES, CLUSTER, CPU, VERSIONS, Case, of_kind
from worker.backends.kubernetes import layout
from worker.backends.kubernetes.backend import _egress_rules
from worker.backends.kubernetes.network import ip_block, training_network_policy
from worker.backends.kubernetes.objects import TRAINING_LABEL

TWO = Case("tensorflow", 2, CPU)
OTHER = Case("tensorflow", 2, CPU, training_id="fedcba654321")
OWN = {"podSelector": {"matchLabels": {TRAINING_LABEL: "abc123def456"}}}
DNS_RULE = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}
REDIS = PodPeer((("app.kubernetes.io/component", "redis"),))
MINIO_ELSEWHERE = PodPeer((("app", "minio"),), namespace="storage")


def policy(egress: EgressRules = EgressRules(), case: Case = TWO) -> dict[str, Any]:
    return training_network_policy(case.inputs(), CLUSTER, egress)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector["matchLabels"].items() <= labels.items()


# -- what it selects ---------------------------------------------------------------------


def test_the_policy_selects_exactly_the_trainings_pods() -> None:
    np = policy()
    assert np["kind"] == "NetworkPolicy" and np["apiVersion"] == "networking.k8s.io/v1"
    assert np["metadata"]["name"] == "learner-abc123def456-network"
    assert np["metadata"]["namespace"] == CLUSTER.namespace
    selector = np["spec"]["podSelector"]
    assert selector == {"matchLabels": {TRAINING_LABEL: "abc123def456"}}
    mine = of_kind(TWO.objects(), "Pod")
    assert len(mine) == 2
    assert all(selects(selector, p["metadata"]["labels"]) for p in mine)
    assert not any(
        selects(selector, p["metadata"]["labels"]) for p in of_kind(OTHER.objects(), "Pod")
    )
    # The same selector as the training's Service: the pods that are the training's.
    (service,) = of_kind(TWO.objects(), "Service")
    assert service["spec"]["selector"] == selector["matchLabels"]


def test_the_policy_is_owned_and_labelled_like_the_trainings_other_objects() -> None:
    np = policy()
    (secret,) = of_kind(TWO.objects(), "Secret")
    assert np["metadata"]["ownerReferences"] == secret["metadata"]["ownerReferences"]
    assert np["metadata"]["labels"] == secret["metadata"]["labels"]


# -- what it allows ----------------------------------------------------------------------


def test_ingress_only_from_the_same_trainings_pods() -> None:
    spec = policy()["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"from": [OWN]}]


@pytest.mark.parametrize(
    ("egress", "endpoints"),
    [
        # Nothing configured: no third rule at all (a rule without peers allows anywhere).
        (EgressRules(), None),
        (
            EgressRules(cidrs=("203.0.113.0/24",), ports=(443,)),
            {
                "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                "ports": [{"protocol": "TCP", "port": 443}],
            },
        ),
        # A range that holds the metadata address has it as an except.
        (
            EgressRules(cidrs=("0.0.0.0/0",), denied=("10.0.0.0/8",)),
            {
                "to": [
                    {
                        "ipBlock": {
                            "cidr": "0.0.0.0/0",
                            "except": ["169.254.169.254/32", "10.0.0.0/8"],
                        }
                    }
                ]
            },
        ),
        (
            EgressRules(cidrs=("169.254.0.0/16", "10.1.2.0/24"), denied=("10.96.0.0/12",)),
            {
                "to": [
                    {"ipBlock": {"cidr": "169.254.0.0/16", "except": ["169.254.169.254/32"]}},
                    # A denied range that does not lie inside is no except (the API
                    # refuses one).
                    {"ipBlock": {"cidr": "10.1.2.0/24"}},
                ]
            },
        ),
        (
            EgressRules(cidrs=("::/0",)),
            {"to": [{"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}}]},
        ),
        (
            EgressRules(pods=(REDIS, MINIO_ELSEWHERE), ports=(6379, 9000)),
            {
                "to": [
                    {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "redis"}}},
                    {
                        "podSelector": {"matchLabels": {"app": "minio"}},
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "storage"}
                        },
                    },
                ],
                "ports": [{"protocol": "TCP", "port": 6379}, {"protocol": "TCP", "port": 9000}],
            },
        ),
    ],
    ids=["nothing", "one-cidr", "everywhere", "link-local", "ipv6", "pods"],
)
def test_egress_only_to_the_training_dns_and_the_configured_endpoints(
    egress: EgressRules, endpoints: dict[str, Any] | None
) -> None:
    expected = [{"to": [OWN]}, DNS_RULE] + ([endpoints] if endpoints else [])
    assert policy(egress)["spec"]["egress"] == expected


def test_no_egress_rule_is_ever_without_peers() -> None:
    for egress in (EgressRules(), EgressRules(ports=(443,)), EgressRules(cidrs=("10.0.0.0/8",))):
        for rule in policy(egress)["spec"]["egress"]:
            assert rule["to"], rule


@pytest.mark.parametrize(
    ("cidr", "denied", "excepted"),
    [
        ("0.0.0.0/0", (), ["169.254.169.254/32"]),
        ("169.254.169.0/24", (), ["169.254.169.254/32"]),
        (
            "10.0.0.0/8",
            ("10.96.0.0/12", "10.244.0.0/16", "192.168.0.0/16"),
            ["10.96.0.0/12", "10.244.0.0/16"],
        ),
        ("10.0.0.0/8", ("10.0.0.0/8",), []),  # equal, not strictly inside: refused below
        ("203.0.113.7/32", (), []),
    ],
)
def test_excepts_are_the_denied_ranges_strictly_inside(
    cidr: str, denied: tuple[str, ...], excepted: list[str]
) -> None:
    block = ip_block(cidr, denied)
    assert block.get("except", []) == excepted
    assert block["cidr"] == cidr


@pytest.mark.parametrize(
    ("cidrs", "denied"),
    [
        (("169.254.169.254/32",), ()),
        (("169.254.169.254/32",), ("10.0.0.0/8",)),
        (("10.96.0.10/32",), ("10.96.0.0/12",)),
        (("10.96.0.0/12",), ("10.96.0.0/12",)),
        (("fd00:ec2::254/128",), ()),
    ],
)
def test_an_egress_cidr_inside_a_denied_range_is_refused(
    cidrs: tuple[str, ...], denied: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match="lies inside the denied range"):
        EgressRules(cidrs=cidrs, denied=denied)


# -- the API's schema ----------------------------------------------------------------------

EGRESS_CASES = {
    "none": EgressRules(),
    "full": EgressRules(
        cidrs=("0.0.0.0/0", "2001:db8::/32"),
        pods=(REDIS, MINIO_ELSEWHERE),
        ports=(443, 6379),
        denied=("10.96.0.0/12",),
    ),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("egress", sorted(EGRESS_CASES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_policy_passes_strict_validation(case: str, egress: str, version: str) -> None:
    np = training_network_policy(CASES[case].inputs(), CLUSTER, EGRESS_CASES[egress])
    kubernetes_validate.validate(np, version, strict=True)


def test_the_strict_validation_refuses_a_broken_policy() -> None:
    np = copy.deepcopy(policy(EGRESS_CASES["full"]))
    np["spec"]["egress"][2]["to"][0]["ipBlock"]["exceptions"] = ["10.0.0.0/16"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(np, VERSIONS[0], strict=True)


# -- the settings --------------------------------------------------------------------------


def test_the_settings_give_the_backend_its_egress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLAAS_K8S_EGRESS_CIDRS", " 203.0.113.0/24, 2001:db8::/32 ,")
    monkeypatch.setenv(
        "DLAAS_K8S_EGRESS_PODS",
        "app.kubernetes.io/instance=demo,app.kubernetes.io/component=redis; storage:app=minio",
    )
    monkeypatch.setenv("DLAAS_K8S_EGRESS_PORTS", "443,6379")
    monkeypatch.setenv("DLAAS_K8S_EGRESS_DENIED_CIDRS", "10.96.0.0/12")
    assert _egress_rules(Settings()) == EgressRules(
        cidrs=("203.0.113.0/24", "2001:db8::/32"),
        pods=(
            PodPeer(
                (("app.kubernetes.io/instance", "demo"), ("app.kubernetes.io/component", "redis"))
            ),
            PodPeer((("app", "minio"),), namespace="storage"),
        ),
        ports=(443, 6379),
        denied=("10.96.0.0/12",),
    )
    monkeypatch.setenv("DLAAS_K8S_NETWORK_POLICY", "false")
    assert _egress_rules(Settings()) is None


def test_by_default_a_policy_allows_only_the_training_and_dns() -> None:
    settings = Settings()
    assert settings.k8s_network_policy is True
    assert _egress_rules(settings) == EgressRules()


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DLAAS_K8S_EGRESS_CIDRS", "10.0.0.1/8", "egress CIDR '10.0.0.1/8' is not a CIDR"),
        ("DLAAS_K8S_EGRESS_CIDRS", "minio.example.com", "is not a CIDR"),
        ("DLAAS_K8S_EGRESS_CIDRS", "169.254.169.254/32", "inside the denied range"),
        ("DLAAS_K8S_EGRESS_DENIED_CIDRS", "10.96.0.0/33", "denied range '10.96.0.0/33'"),
        ("DLAAS_K8S_EGRESS_PORTS", "443,https", "'https' is not a port number"),
        ("DLAAS_K8S_EGRESS_PORTS", "70000", "'70000' is not a port number"),
        ("DLAAS_K8S_EGRESS_PODS", "app", "'app' in the egress pods 'app' is not KEY=VALUE"),
        ("DLAAS_K8S_EGRESS_PODS", "Bad_NS:app=x", "'Bad_NS' in the egress pods"),
        ("DLAAS_K8S_EGRESS_PODS", "app=not a value", "is not KEY=VALUE"),
    ],
)
def test_bad_egress_settings_are_refused_naming_them(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=says) as refused:
        Settings()
    if "inside the denied range" not in says:  # that one is of two settings together
        assert name.removeprefix("DLAAS_").lower() in str(refused.value)


def test_ports_and_pod_peers_parse() -> None:
    assert parse_ports("443, 6379,443,") == (443, 6379)
    assert parse_pod_peers(" ; a=b ;ns-1:x.io/k=v,c=d;") == (
        PodPeer((("a", "b"),)),
        PodPeer((("x.io/k", "v"), ("c", "d")), namespace="ns-1"),
    )


# -- hardened pods -------------------------------------------------------------------------

WRITABLE = {"work": layout.WORK_DIR, "io": layout.IO_DIR, "tmp": layout.TMP_DIR}


@pytest.mark.parametrize("case", sorted(CASES))
def test_learner_pods_are_hardened(case: str) -> None:
    for pod in of_kind(CASES[case].objects(), "Pod"):
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["enableServiceLinks"] is False
        assert "serviceAccountName" not in spec and "hostNetwork" not in spec
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == layout.RUN_AS_USER != 0
        assert security["runAsGroup"] == layout.RUN_AS_GROUP != 0
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {v["name"]: v for v in spec["volumes"]}
        containers = spec["initContainers"] + spec["containers"]
        assert {c["name"] for c in containers} == {"fetch", "agent", "learner"}
        for c in containers:
            assert c["securityContext"] == {
                "runAsNonRoot": True,
                "runAsUser": layout.RUN_AS_USER,
                "runAsGroup": layout.RUN_AS_GROUP,
                "seccompProfile": {"type": "RuntimeDefault"},
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, c["name"]
            # Writable: only emptyDirs, at the training's directories, io and /tmp.
            writable = {
                m["name"]: m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")
            }
            assert writable.items() <= WRITABLE.items(), c["name"]
            assert all("emptyDir" in volumes[name] for name in writable)
            assert writable["tmp"] == "/tmp" and writable["work"] == layout.WORK_DIR
            for m in c["volumeMounts"]:
                if "secret" in volumes[m["name"]]:
                    assert m.get("readOnly") is True
        # What the command needs to write lies in those volumes: HOME (ssh's keys, caches),
        # the training's directories; sshd (MPI hosts) runs unprivileged with PidFile=none.
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        for name in ("HOME", "MODEL_DIR", "DATA_DIR", "RESULT_DIR", "LOG_DIR", "CHECKPOINT_DIR"):
            assert env[name].startswith(layout.WORK_DIR + "/"), name


# -- dlaas up ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({}, True),  # the policy would let the pods reach no store
        ({"DLAAS_K8S_EGRESS_CIDRS": "10.0.0.5/32"}, False),
        ({"DLAAS_K8S_EGRESS_PODS": "app=minio"}, False),
        ({"DLAAS_K8S_EGRESS_PORTS": "9000"}, True),  # ports alone open nothing
        ({"DLAAS_K8S_NETWORK_POLICY": "false"}, False),
    ],
)
def test_dlaas_up_refuses_a_policy_that_lets_the_pods_reach_no_store(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], refused: bool
) -> None:
    for name in [n for n in os.environ if n.startswith("DLAAS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    problems = kubernetes_network_problems(Settings(backend="kubernetes"))
    assert bool(problems) is refused
    if refused:
        assert "DLAAS_K8S_EGRESS_CIDRS" in problems[0]
        assert "DLAAS_K8S_NETWORK_POLICY=false" in problems[0]
