"""The emulated Kubernetes API answers the official client as a control loop needs: objects
created, listed by label, watched from a resourceVersion (ADDED, MODIFIED as the kubelet
sets a pod's status, DELETED), and 410 Gone for a version too old to resume from."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from tests.k8s.conftest import NAMESPACE
from tests.k8s_emulator import (
    RunningApiserver,
    gone,
    parse_label_selector,
    running_apiserver,
)

TRAINING = "training-abc"


def pod_body(name: str, learner_id: int, training: str = TRAINING) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "dlaas.io/training-id": training,
                "dlaas.io/tenant": "acme",
                "dlaas.io/learner-id": str(learner_id),
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "learner", "image": "dlaas/learner-tensorflow:2.21"}],
        },
    }


def running_status(started: str) -> dict[str, Any]:
    """What a kubelet writes once the learner container started."""
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "learner",
                    "image": "dlaas/learner-tensorflow:2.21",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started}},
                }
            ],
        }
    }


def events(core: client.CoreV1Api, **kwargs: Any) -> list[tuple[str, str, str | None, str]]:
    """(type, name, pod phase, resourceVersion) of every event a bounded watch streams."""
    out = []
    for event in watch.Watch().stream(core.list_namespaced_pod, NAMESPACE, **kwargs):
        pod = event["object"]
        out.append(
            (event["type"], pod.metadata.name, pod.status.phase, pod.metadata.resource_version)
        )
    return out


def test_namespaced_objects_are_created_as_the_api_server_would(
    core: client.CoreV1Api, k8s_apiserver: RunningApiserver
) -> None:
    pod = core.create_namespaced_pod(NAMESPACE, pod_body(f"{TRAINING}-1", 1))
    assert pod.metadata.namespace == NAMESPACE
    assert pod.metadata.uid and pod.metadata.creation_timestamp is not None
    assert pod.status.phase == "Pending"
    service = core.create_namespaced_service(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": TRAINING, "labels": {"dlaas.io/training-id": TRAINING}},
            "spec": {"clusterIP": "None", "selector": {"dlaas.io/training-id": TRAINING}},
        },
    )
    secret = core.create_namespaced_secret(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": TRAINING},
            "stringData": {"store.json": "{}"},
        },
    )
    versions = [int(o.metadata.resource_version) for o in (pod, service, secret)]
    assert versions == sorted(versions) and len(set(versions)) == 3

    assert core.read_namespaced_service(TRAINING, NAMESPACE).spec.cluster_ip == "None"
    assert core.read_namespaced_secret(TRAINING, NAMESPACE).metadata.uid == secret.metadata.uid
    with pytest.raises(ApiException) as conflict:
        core.create_namespaced_pod(NAMESPACE, pod_body(f"{TRAINING}-1", 1))
    assert conflict.value.status == 409
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("no-such-pod", NAMESPACE)
    assert missing.value.status == 404
    # The client authenticated as the kubeconfig says.
    last = list(k8s_apiserver.emulator)[-1]
    assert last.headers["Authorization"] == "Bearer emulator"


def test_pods_are_listed_by_label_selector(core: client.CoreV1Api) -> None:
    for i in (1, 2):
        core.create_namespaced_pod(NAMESPACE, pod_body(f"{TRAINING}-{i}", i))
    core.create_namespaced_pod(NAMESPACE, pod_body("training-xyz-1", 1, training="training-xyz"))
    core.create_namespaced_pod("elsewhere", pod_body(f"{TRAINING}-9", 9))

    def names(selector: str) -> list[str]:
        found = core.list_namespaced_pod(NAMESPACE, label_selector=selector)
        return sorted(p.metadata.name for p in found.items)

    assert names(f"dlaas.io/training-id={TRAINING}") == [f"{TRAINING}-1", f"{TRAINING}-2"]
    assert names(f"dlaas.io/training-id={TRAINING},dlaas.io/learner-id=2") == [f"{TRAINING}-2"]
    assert names(f"dlaas.io/training-id!={TRAINING}") == ["training-xyz-1"]
    assert names("dlaas.io/training-id in (training-xyz, nothing)") == ["training-xyz-1"]
    assert names("dlaas.io/tenant") == [f"{TRAINING}-1", f"{TRAINING}-2", "training-xyz-1"]
    assert names("!dlaas.io/tenant") == []
    listed = core.list_namespaced_pod(NAMESPACE)
    assert int(listed.metadata.resource_version) >= 3


def test_a_watch_resumed_from_a_list_sees_added_modified_deleted(core: client.CoreV1Api) -> None:
    name = f"{TRAINING}-1"
    selector = f"dlaas.io/training-id={TRAINING}"
    since = core.list_namespaced_pod(NAMESPACE, label_selector=selector).metadata.resource_version
    core.create_namespaced_pod(NAMESPACE, pod_body(name, 1))
    core.create_namespaced_pod(NAMESPACE, pod_body("other-1", 1, training="other"))
    # The test plays the kubelet: the pod's status through the status subresource.
    core.patch_namespaced_pod_status(name, NAMESPACE, running_status("2026-11-24T00:00:05Z"))
    core.delete_namespaced_pod(name, NAMESPACE)

    seen = events(core, label_selector=selector, resource_version=since, timeout_seconds=1)
    assert [(t, n, phase) for t, n, phase, _ in seen] == [
        ("ADDED", name, "Pending"),
        ("MODIFIED", name, "Running"),
        ("DELETED", name, "Running"),
    ]
    versions = [int(rv) for *_, rv in seen]
    assert versions == sorted(versions) and versions[0] > int(since)

    # Resumed from the MODIFIED event's version: only what came after it.
    after = events(core, label_selector=selector, resource_version=seen[1][3], timeout_seconds=1)
    assert [(t, n) for t, n, *_ in after] == [("DELETED", name)]


def test_a_live_watch_follows_the_kubelet(core: client.CoreV1Api) -> None:
    name = f"{TRAINING}-2"
    core.create_namespaced_pod(NAMESPACE, pod_body(name, 2))
    seen: list[tuple[str, str | None]] = []
    streaming = threading.Event()
    stream = watch.Watch()

    def follow() -> None:
        for event in stream.stream(
            core.list_namespaced_pod,
            NAMESPACE,
            label_selector=f"dlaas.io/training-id={TRAINING}",
            timeout_seconds=10,
        ):
            seen.append((event["type"], event["object"].status.phase))
            streaming.set()
            if event["type"] == "DELETED":
                stream.stop()

    follower = threading.Thread(target=follow)
    follower.start()
    assert streaming.wait(5)  # no version given: the current pod comes first, as ADDED
    core.patch_namespaced_pod_status(name, NAMESPACE, running_status("2026-11-24T00:00:05Z"))
    core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {"phase": "Succeeded"}})
    core.delete_namespaced_pod(name, NAMESPACE)
    follower.join(10)
    assert not follower.is_alive()
    assert seen == [
        ("ADDED", "Pending"),
        ("MODIFIED", "Running"),
        ("MODIFIED", "Succeeded"),
        ("DELETED", "Succeeded"),
    ]


def test_a_watch_ends_at_its_timeout(core: client.CoreV1Api) -> None:
    since = core.list_namespaced_pod(NAMESPACE).metadata.resource_version
    started = time.monotonic()
    assert events(core, resource_version=since, timeout_seconds=1) == []
    assert 0.9 <= time.monotonic() - started < 5


def test_a_watch_from_a_compacted_version_gets_410_gone(
    core: client.CoreV1Api, k8s_apiserver: RunningApiserver
) -> None:
    core.create_namespaced_pod(NAMESPACE, pod_body(f"{TRAINING}-1", 1))
    old = core.list_namespaced_pod(NAMESPACE).metadata.resource_version
    core.patch_namespaced_pod_status(f"{TRAINING}-1", NAMESPACE, {"status": {"phase": "Running"}})
    k8s_apiserver.compact()

    with pytest.raises(ApiException) as expired:
        events(core, resource_version=old, timeout_seconds=1)
    assert expired.value.status == 410
    assert "too old resource version" in str(expired.value.reason)

    # The remedy: relist, then watch from the list's version.
    relisted = core.list_namespaced_pod(NAMESPACE)
    assert [p.status.phase for p in relisted.items] == ["Running"]
    assert (
        events(core, resource_version=relisted.metadata.resource_version, timeout_seconds=1) == []
    )


def test_history_is_bounded(tmp_path: Path) -> None:
    with running_apiserver(tmp_path, history_limit=2) as apiserver:
        api = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
        core = client.CoreV1Api(api)
        first = core.create_namespaced_pod(NAMESPACE, pod_body("a-1", 1)).metadata.resource_version
        for name in ("b-1", "c-1", "d-1"):
            core.create_namespaced_pod(NAMESPACE, pod_body(name, 1))
        with pytest.raises(ApiException) as expired:
            events(core, resource_version=first, timeout_seconds=1)
        assert expired.value.status == 410
        recent = events(core, resource_version=str(int(first) + 1), timeout_seconds=1)
        assert [n for _, n, *_ in recent] == ["c-1", "d-1"]
        api.close()


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": ""}, True),
        ("a notin (1,2)", {"a": "2"}, False),
        ("!a", {"b": "1"}, True),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selector_forms(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_label_selector(selector)(labels) is matches


def test_what_kmock_alone_does() -> None:
    """Why Apiserver exists, and kmock's own way to a 410: kmock alone answers the client's
    `watch=True` with a list (the official Watch reads it as no events, silently), lists
    carry no real resourceVersion, and a watch never expires; a reaction can script the
    410 Gone answer for one request, which is all its reaction API offers."""

    async def check() -> None:
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
            emulator.objects["v1/pods", NAMESPACE, "p"] = {"metadata": {"name": "p"}}
            pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
            answer = await emulator.get(f"{pods}?watch=True")
            body = await answer.json()
            assert "items" in body  # a list, not a stream of events
            assert body["metadata"]["resourceVersion"] == "..."

            emulator[f"get {pods}", kmock.params(watch="True", resourceVersion="5")] << (
                gone(5, 9),
            )
            answer = await emulator.get(f"{pods}?watch=True&resourceVersion=5")
            lines = (await answer.text()).splitlines()
            assert [json.loads(line)["object"]["code"] for line in lines] == [410]

    asyncio.run(check())


def test_deleting_an_owner_deletes_what_it_owns(core: client.CoreV1Api) -> None:
    owner = core.create_namespaced_service(
        NAMESPACE,
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": TRAINING}, "spec": {}},
    )
    owned_by = {
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Service", "name": TRAINING, "uid": owner.metadata.uid}
        ]
    }
    for i in (1, 2):
        body = pod_body(f"{TRAINING}-{i}", i)
        body["metadata"].update(owned_by)
        core.create_namespaced_pod(NAMESPACE, body)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": TRAINING, **owned_by}}
    core.create_namespaced_secret(NAMESPACE, secret)
    core.create_namespaced_pod(NAMESPACE, pod_body("unowned-1", 1, training="unowned"))
    since = core.list_namespaced_pod(NAMESPACE).metadata.resource_version

    core.delete_namespaced_service(TRAINING, NAMESPACE)

    assert [p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items] == ["unowned-1"]
    assert core.list_namespaced_secret(NAMESPACE).items == []
    gone_pods = events(core, resource_version=since, timeout_seconds=1)
    assert sorted((t, n) for t, n, *_ in gone_pods) == [
        ("DELETED", f"{TRAINING}-1"),
        ("DELETED", f"{TRAINING}-2"),
    ]


def test_delete_collection_by_label(core: client.CoreV1Api) -> None:
    for i in (1, 2):
        core.create_namespaced_pod(NAMESPACE, pod_body(f"{TRAINING}-{i}", i))
    core.create_namespaced_pod(NAMESPACE, pod_body("other-1", 1, training="other"))
    core.delete_collection_namespaced_pod(
        NAMESPACE, label_selector=f"dlaas.io/training-id={TRAINING}"
    )
    assert [p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items] == ["other-1"]


def test_an_orphaning_delete_leaves_dependents(core: client.CoreV1Api) -> None:
    owner = core.create_namespaced_secret(
        NAMESPACE, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "owner"}}
    )
    body = pod_body(f"{TRAINING}-1", 1)
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Secret", "name": "owner", "uid": owner.metadata.uid}
    ]
    core.create_namespaced_pod(NAMESPACE, body)
    core.delete_namespaced_secret("owner", NAMESPACE, propagation_policy="Orphan")
    assert [p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items] == [f"{TRAINING}-1"]


def test_a_pod_on_a_node_is_deleted_gracefully(core: client.CoreV1Api) -> None:
    name = f"{TRAINING}-1"
    body = pod_body(name, 1)
    body["spec"]["nodeName"] = "node-1"
    body["spec"]["terminationGracePeriodSeconds"] = 20
    core.create_namespaced_pod(NAMESPACE, body)
    since = core.list_namespaced_pod(NAMESPACE).metadata.resource_version

    asked = time.time()
    core.delete_namespaced_pod(name, NAMESPACE)
    terminating = core.read_namespaced_pod(name, NAMESPACE)
    assert terminating.metadata.deletion_grace_period_seconds == 20
    assert 19 <= terminating.metadata.deletion_timestamp.timestamp() - asked <= 21
    core.delete_namespaced_pod(name, NAMESPACE)  # again: no change, still terminating
    # The kubelet stops the containers, then removes the pod.
    core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {"phase": "Failed"}})
    core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)

    assert core.list_namespaced_pod(NAMESPACE).items == []
    seen = events(core, resource_version=since, timeout_seconds=1)
    assert [(t, phase) for t, _, phase, _ in seen] == [
        ("MODIFIED", "Pending"),
        ("MODIFIED", "Failed"),
        ("DELETED", "Failed"),
    ]
