"""The chart's NetworkPolicies and hardened pods, rendered offline: a default-deny policy for
learner pods, each platform component accepting only what it serves (PostgreSQL only from
the platform, Redis and MinIO from the platform and the learners' agents, the API on its
port), the per-training policy's settings (the bundled Redis and MinIO as egress), all
switched off by networkPolicy.enabled=false with NOTES.txt saying what that leaves open.
Each selector is evaluated against the labels of the pods the chart and the backend make."""

from __future__ import annotations

import copy
import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from service.settings import Settings
from tests.deploy.chart import EXTERNAL_VALUES, RELEASE, env_of, named, objects, pod_spec, render
from tests.unit.test_k8s_objects import CASES, of_kind
from worker.backends.kubernetes.backend import _egress_rules

FULLNAME = f"{RELEASE}-dlaas"


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector as the API server reads it (matchLabels and matchExpressions)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def workload_labels(objs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Component -> the labels of its pods."""
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["metadata"][
            "labels"
        ]
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet", "Job")
    }


def learner_labels() -> list[dict[str, str]]:
    return [
        p["metadata"]["labels"] for case in CASES for p in of_kind(CASES[case].objects(), "Pod")
    ]


def policies(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}


def allowed_from(policy: dict[str, Any], labels: dict[str, str]) -> set[int]:
    """The ports a pod with `labels` (in the namespace) may reach on the policy's pods."""
    ports: set[int] = set()
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from")
        if peers is None or any(
            "podSelector" in p
            and "namespaceSelector" not in p
            and matches(p["podSelector"], labels)
            for p in peers
        ):
            ports |= {p["port"] for p in rule.get("ports", [])} or {0}
    return ports


@pytest.fixture(scope="module")
def default_objects() -> list[dict[str, Any]]:
    return objects()


@pytest.fixture(scope="module")
def external_objects() -> list[dict[str, Any]]:
    return objects(EXTERNAL_VALUES)


def test_the_policies_rendered(
    default_objects: list[dict[str, Any]], external_objects: list[dict[str, Any]]
) -> None:
    common = {f"{FULLNAME}-{n}" for n in ("learners-default-deny", "api", "controllers")}
    assert set(policies(default_objects)) == common | {
        f"{FULLNAME}-{n}" for n in ("postgresql", "redis", "minio")
    }
    # External services are the operator's to isolate; the scoring service is enabled there.
    assert set(policies(external_objects)) == common | {f"{FULLNAME}-scoring"}


def test_learner_pods_are_denied_everything_by_default(
    default_objects: list[dict[str, Any]],
) -> None:
    deny = policies(default_objects)[f"{FULLNAME}-learners-default-deny"]
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]
    selector = deny["spec"]["podSelector"]
    assert all(matches(selector, labels) for labels in learner_labels())
    assert not any(
        matches(selector, labels) for labels in workload_labels(default_objects).values()
    )


def test_each_component_accepts_only_what_it_serves(
    default_objects: list[dict[str, Any]], external_objects: list[dict[str, Any]]
) -> None:
    pods = workload_labels(default_objects)
    found = policies(default_objects)
    platform = ("api", "worker", "monitor", "migrations")
    learner = learner_labels()[0]
    # Every platform pod is selected by exactly one policy.
    for component, labels in pods.items():
        selecting = [n for n, p in found.items() if matches(p["spec"]["podSelector"], labels)]
        assert len(selecting) == 1, (component, selecting)
    postgresql = found[f"{FULLNAME}-postgresql"]
    assert all(allowed_from(postgresql, pods[c]) == {5432} for c in platform)
    assert allowed_from(postgresql, learner) == set()
    for name, port in (("redis", 6379), ("minio", 9000)):
        policy = found[f"{FULLNAME}-{name}"]
        assert all(allowed_from(policy, pods[c]) == {port} for c in platform)
        assert allowed_from(policy, learner) == {port}  # the agent's logs, fetch's code
        assert allowed_from(policy, {"app": "something-else"}) == set()
    controllers = found[f"{FULLNAME}-controllers"]
    assert controllers["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in controllers["spec"]
    assert all(matches(controllers["spec"]["podSelector"], pods[c]) for c in ("worker", "monitor"))
    api = found[f"{FULLNAME}-api"]
    assert api["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}]}]
    scoring = policies(external_objects)[f"{FULLNAME}-scoring"]
    external_pods = workload_labels(external_objects)
    assert allowed_from(scoring, external_pods["api"]) == {8081}
    assert allowed_from(scoring, external_pods["worker"]) == set()
    assert allowed_from(scoring, learner) == set()


def test_the_api_accepts_only_the_peers_given() -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    api = named(objects({"networkPolicy": {"apiFrom": [peer]}}), "NetworkPolicy", f"{FULLNAME}-api")
    assert api["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8080}], "from": [peer]}
    ]


def _network_env(objs: list[dict[str, Any]]) -> dict[str, str]:
    worker = named(objs, "Deployment", f"{FULLNAME}-worker")
    env = env_of(pod_spec(worker)["containers"][0])
    return {k: v["value"] for k, v in env.items() if "NETWORK" in k or "EGRESS" in k}


def test_the_per_training_policy_reaches_the_bundled_redis_and_minio(
    default_objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _network_env(default_objects)
    assert env["DLAAS_K8S_NETWORK_POLICY"] == "true"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    egress = _egress_rules(Settings())
    assert egress is not None and egress.cidrs == () and egress.ports == ()
    pods = workload_labels(default_objects)
    for peer in egress.pods:
        assert peer.namespace is None  # the release's namespace, the learners'
    reached = {
        c
        for c, labels in pods.items()
        for p in egress.pods
        if matches(p.peer()["podSelector"], labels)
    }
    assert reached == {"redis", "minio"}


def test_the_operators_egress_reaches_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    values = copy.deepcopy(EXTERNAL_VALUES)
    values["networkPolicy"] = {
        "egressCIDRs": ["52.216.0.0/15", "203.0.113.10/32"],
        "egressPorts": [443, 6379],
        "deniedCIDRs": ["10.0.0.0/8"],
        "egressPods": ["storage:app=minio"],
    }
    env = _network_env(objects(values))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    egress = _egress_rules(Settings())
    assert egress is not None
    assert egress.cidrs == ("52.216.0.0/15", "203.0.113.10/32")
    assert egress.ports == (443, 6379)
    assert egress.denied == ("10.0.0.0/8",)
    assert [(p.namespace, p.labels) for p in egress.pods] == [("storage", (("app", "minio"),))]
    # With a bundled Redis and MinIO, their pods and ports are added to the operator's.
    values["redis"] = {"bundled": True}
    values["s3"] = {"bundled": True}
    for name, value in _network_env(objects(values)).items():
        monkeypatch.setenv(name, value)
    egress = _egress_rules(Settings())
    assert egress is not None and egress.ports == (443, 6379, 9000)
    assert [dict(p.labels)["app.kubernetes.io/component"] for p in egress.pods[:2]] == [
        "redis",
        "minio",
    ]


def test_every_policy_validates_against_kubernetes_1_30(
    default_objects: list[dict[str, Any]], external_objects: list[dict[str, Any]]
) -> None:
    checked = [o for o in default_objects + external_objects if o["kind"] == "NetworkPolicy"]
    assert len(checked) == 10
    for policy in checked:
        kubernetes_validate.validate(policy, "1.30.0", strict=True)


def test_switched_off_no_policy_is_made_and_the_notes_say_what_that_leaves_open() -> None:
    values = {"networkPolicy": {"enabled": False}}
    objs = objects(values)
    assert policies(objs) == {}
    assert _network_env(objs) == {"DLAAS_K8S_NETWORK_POLICY": "false"}
    notes = render(values)["dlaas/templates/NOTES.txt"]
    assert "WARNING: networkPolicy.enabled is false" in notes
    assert "metadata address" in notes
    enabled = render()["dlaas/templates/NOTES.txt"]
    assert "network plugin that implements NetworkPolicy" in enabled
    assert "networkPolicy.enabled=false" in enabled
    assert "learners cannot reach them" not in enabled  # the bundled store and Redis


def test_the_notes_warn_when_an_external_store_is_out_of_the_learners_reach() -> None:
    notes = render(EXTERNAL_VALUES)["dlaas/templates/NOTES.txt"]
    assert "learners cannot reach them" in notes
    values = copy.deepcopy(EXTERNAL_VALUES)
    values["networkPolicy"] = {"egressCIDRs": ["52.216.0.0/15"], "egressPorts": [443, 6379]}
    assert "learners cannot reach them" not in render(values)["dlaas/templates/NOTES.txt"]


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"networkPolicy": {"enabeld": False}}, "additional properties 'enabeld' not allowed"),
        ({"networkPolicy": {"egressPorts": [70000]}}, "/networkPolicy/egressPorts/0"),
        ({"networkPolicy": {"egressCIDRs": "10.0.0.0/8"}}, "/networkPolicy/egressCIDRs"),
        ({"networkPolicy": {"egressPods": ["no-equals-sign"]}}, "/networkPolicy/egressPods/0"),
    ],
)
def test_network_values_the_schema_refuses(values: dict[str, Any], refusal: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(refusal)):
        render(values)


def test_every_platform_pod_is_hardened(
    default_objects: list[dict[str, Any]], external_objects: list[dict[str, Any]]
) -> None:
    for obj in default_objects + external_objects:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = pod_spec(obj)
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, component
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        for container in spec["containers"] + spec.get("initContainers", []):
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, component
            assert security["capabilities"] == {"drop": ["ALL"]}, component
            assert security.get("privileged", False) is False
