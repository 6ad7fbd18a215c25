"""Each training's NetworkPolicy through the backend and the official client against the
emulated API server (which validates NetworkPolicies strictly, as Kubernetes 1.30's schema
says): created with the training before any pod, owned by its Service, selecting exactly
its pods, deleted with it; a start that fails leaves none; none without the setting."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from service.domain.egress import EgressRules, PodPeer
from tests.k8s.conftest import NAMESPACE
from tests.k8s.test_backend import CLUSTER, PREFIX, SELECTOR, TRAINING, eventually, request
from worker.backends.kubernetes.backend import KubernetesBackend

POLICY = f"{PREFIX}-network"
EGRESS = EgressRules(
    cidrs=("0.0.0.0/0",),
    pods=(PodPeer((("app.kubernetes.io/component", "redis"),)),),
    ports=(443, 6379),
    denied=("10.96.0.0/12",),
)


@pytest.fixture
def make_backend(k8s_api: client.ApiClient) -> Iterator[Callable[..., KubernetesBackend]]:
    made: list[KubernetesBackend] = []

    def make(**kwargs: Any) -> KubernetesBackend:
        backend = KubernetesBackend(k8s_api, CLUSTER, stop_grace_seconds=1, **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def networking(k8s_api: client.ApiClient) -> client.NetworkingV1Api:
    return client.NetworkingV1Api(k8s_api)


def policies(networking: client.NetworkingV1Api, selector: str = SELECTOR) -> list[Any]:
    return list(networking.list_namespaced_network_policy(NAMESPACE, label_selector=selector).items)


def raw_policies(networking: client.NetworkingV1Api) -> list[dict[str, Any]]:
    """The policies as the API server holds them (its JSON, not the client's models)."""
    response = networking.list_namespaced_network_policy(
        NAMESPACE, label_selector=SELECTOR, _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items


def test_a_two_learner_training_gets_a_policy_selecting_exactly_its_pods(
    make_backend: Callable[..., KubernetesBackend],
    core: client.CoreV1Api,
    networking: client.NetworkingV1Api,
) -> None:
    backend = make_backend(egress=EGRESS)
    backend.start(request(nodes=2))
    backend.start(request("training-other", nodes=1))
    (np,) = raw_policies(networking)
    assert np["metadata"]["name"] == POLICY
    service = core.read_namespaced_service(PREFIX, NAMESPACE)
    (owner,) = np["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Service", PREFIX, service.metadata.uid)
    # Its selector, asked of the API server, finds this training's two pods and no other.
    match = np["spec"]["podSelector"]["matchLabels"]
    selected = core.list_namespaced_pod(
        NAMESPACE, label_selector=",".join(f"{k}={v}" for k, v in match.items())
    ).items
    assert sorted(p.metadata.name for p in selected) == [f"{PREFIX}-1", f"{PREFIX}-2"]
    assert len(core.list_namespaced_pod(NAMESPACE).items) == 3
    # Ingress from the training's own pods; egress to them, DNS and what was configured.
    own = {"podSelector": {"matchLabels": match}}
    assert np["spec"]["ingress"] == [{"from": [own]}]
    egress = np["spec"]["egress"]
    assert egress[0] == {"to": [own]}
    assert {p["port"] for p in egress[1]["ports"]} == {53}
    assert egress[2] == {
        "to": [
            {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32", "10.96.0.0/12"]}},
            {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "redis"}}},
        ],
        "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6379}],
    }
    assert len(egress) == 3


def test_the_policy_is_made_before_the_pods_and_goes_with_the_training(
    make_backend: Callable[..., KubernetesBackend],
    networking: client.NetworkingV1Api,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = make_backend()
    pods_seen: list[int] = []
    real_pod = backend.core.create_namespaced_pod

    def pod(*args: Any, **kw: Any) -> Any:
        pods_seen.append(len(policies(networking)))
        return real_pod(*args, **kw)

    monkeypatch.setattr(backend.core, "create_namespaced_pod", pod)
    backend.start(request(nodes=2))
    assert pods_seen == [1, 1]  # no pod without its policy
    backend.start(request(nodes=2))  # a second start creates nothing
    assert len(policies(networking)) == 1
    backend.cleanup(TRAINING)
    assert policies(networking) == []


def test_deleting_the_service_deletes_the_policy(
    make_backend: Callable[..., KubernetesBackend],
    core: client.CoreV1Api,
    networking: client.NetworkingV1Api,
) -> None:
    make_backend().start(request())
    core.delete_namespaced_service(PREFIX, NAMESPACE)
    eventually(lambda: policies(networking) == [])


def test_a_failed_start_leaves_no_policy(
    make_backend: Callable[..., KubernetesBackend],
    core: client.CoreV1Api,
    networking: client.NetworkingV1Api,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = make_backend()

    def refused(*args: Any, **kw: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden: exceeded quota")

    monkeypatch.setattr(backend.core, "create_namespaced_pod", refused)
    with pytest.raises(ApiException):
        backend.start(request())
    assert policies(networking, "dlaas.io/training-id") == []
    assert core.list_namespaced_service(NAMESPACE).items == []


def test_a_policy_the_schema_refuses_fails_the_start_and_leaves_nothing(
    make_backend: Callable[..., KubernetesBackend],
    core: client.CoreV1Api,
    networking: client.NetworkingV1Api,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.backends.kubernetes import backend as backend_module

    real = backend_module.training_network_policy

    def misspelt(*args: Any) -> dict[str, Any]:
        policy = real(*args)
        policy["spec"]["policyType"] = policy["spec"].pop("policyTypes")
        return policy

    monkeypatch.setattr(backend_module, "training_network_policy", misspelt)
    with pytest.raises(ApiException) as refused:
        make_backend().start(request())
    assert refused.value.status == 422
    assert "policyType" in str(refused.value.body)
    assert policies(networking, "dlaas.io/training-id") == []
    assert core.list_namespaced_pod(NAMESPACE).items == []
    assert core.list_namespaced_service(NAMESPACE).items == []


def test_without_the_setting_no_policy_is_made(
    make_backend: Callable[..., KubernetesBackend],
    core: client.CoreV1Api,
    networking: client.NetworkingV1Api,
) -> None:
    backend = make_backend(egress=None)
    backend.start(request())
    assert len(core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items) == 2
    assert policies(networking, "dlaas.io/training-id") == []
    backend.cleanup(TRAINING)
    time.sleep(0.1)
    assert core.list_namespaced_service(NAMESPACE).items == []
