"""The gang schedulers' marks on a training's objects (worker.backends.kubernetes.gang),
table-tested without a cluster: the Kueue pod-group labels and annotation on every learner
pod (still valid Kubernetes, strictly), the coscheduling label and schedulerName, the
scheduler-plugins PodGroup, valid against the CRD's schema as its documentation gives it,
and since when the scheduler could not place a pod, as an Observation carries it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from pydantic import ValidationError

from service.domain.gang_release import Unschedulable
from service.settings import Settings
from tests.unit.test_k8s_objects import CASES, CLUSTER, OWNER, of_kind
from worker.backends.kubernetes import pod_states
from worker.backends.kubernetes.gang import (
    KUEUE_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_TOTAL_ANNOTATION,
    POD_GROUP_LABEL,
    GangConfig,
    gang_pod,
    pod_group,
)
from worker.backends.kubernetes.objects import headless_service
from worker.backends.kubernetes.observation import TrainingPods, observation

# Kubernetes 1.30: the oldest release the objects are validated against (native sidecars).
KUBERNETES = "1.30.0"

# The PodGroup custom resource of kubernetes-sigs/scheduler-plugins, API
# scheduling.x-k8s.io/v1alpha1, written here from its published API documentation (the
# PodGroup, PodGroupSpec and PodGroupStatus types of release v0.28; the coscheduling
# plugin's README), not copied from the project: spec.minMember (int32, the pods that
# must be placed together), spec.minResources (quantities), spec.scheduleTimeoutSeconds
# (int32); status as the controller writes it. Strict: any other field is an error, as
# the API server's structural schema would prune or refuse it.
_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9.]+[a-zA-Z]*$"}]}
POD_GROUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "scheduling.x-k8s.io/v1alpha1"},
        "kind": {"const": "PodGroup"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                "ownerReferences": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["apiVersion", "kind", "name", "uid"],
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "name": {"type": "string"},
                            "uid": {"type": "string"},
                            "controller": {"type": "boolean"},
                            "blockOwnerDeletion": {"type": "boolean"},
                        },
                    },
                },
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "minMember": {**_INT32, "minimum": 1},
                "minResources": {"type": "object", "additionalProperties": _QUANTITY},
                "scheduleTimeoutSeconds": _INT32,
            },
        },
        "status": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "phase": {"type": "string"},
                "occupiedBy": {"type": "string"},
                "scheduled": _INT32,
                "running": _INT32,
                "succeeded": _INT32,
                "failed": _INT32,
                "scheduleStartTime": {"type": "string"},
            },
        },
    },
}

KUEUE = GangConfig(kind="kueue", kueue_queue="team-a")
COSCHEDULING = GangConfig(kind="coscheduling", scheduler_name="sched-plugins")


def gang_pods(case: str, gang: GangConfig) -> list[dict[str, Any]]:
    inp = CASES[case].inputs()
    pods = of_kind(CASES[case].objects(), "Pod")
    return [gang_pod(p, inp.prefix, len(inp.plan.learners), gang) for p in pods]


@pytest.mark.parametrize("case", sorted(CASES))
def test_kueue_pods_are_one_pod_group_of_every_learner(case: str) -> None:
    inp = CASES[case].inputs()
    for pod in gang_pods(case, KUEUE):
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels[KUEUE_QUEUE_LABEL] == "team-a"
        assert labels[KUEUE_GROUP_LABEL] == inp.prefix
        assert annotations == {KUEUE_TOTAL_ANNOTATION: str(len(inp.plan.learners))}
        assert KUEUE_TOTAL_ANNOTATION not in labels  # an annotation, as Kueue reads it
        assert "schedulerName" not in pod["spec"]  # Kueue gates pods; the scheduler places
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_coscheduling_pods_name_their_group_and_scheduler(case: str) -> None:
    inp = CASES[case].inputs()
    for pod in gang_pods(case, COSCHEDULING):
        assert pod["metadata"]["labels"][POD_GROUP_LABEL] == inp.prefix
        assert pod["spec"]["schedulerName"] == "sched-plugins"
        assert "annotations" not in pod["metadata"]
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_without_a_gang_scheduler_the_pods_are_unchanged(case: str) -> None:
    plain = of_kind(CASES[case].objects(), "Pod")
    assert gang_pods(case, GangConfig()) == plain
    for pod in plain:
        assert not any(k.startswith(("kueue.", "scheduling.")) for k in pod["metadata"]["labels"])
        assert "schedulerName" not in pod["spec"]


def test_gang_pod_leaves_the_pod_it_was_given_as_it_was() -> None:
    (pod,) = of_kind(CASES["single"].objects(), "Pod")
    before = copy.deepcopy(pod)
    gang_pod(pod, "p", 1, KUEUE)
    gang_pod(pod, "p", 1, COSCHEDULING)
    assert pod == before


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_pod_group_is_valid_owned_and_needs_every_learner(case: str) -> None:
    inp = CASES[case].inputs()
    service = headless_service(inp, CLUSTER)["metadata"]
    group = pod_group(
        inp.prefix, CLUSTER.namespace, len(inp.plan.learners), service["labels"],
        service["ownerReferences"],
    )  # fmt: skip
    jsonschema.validate(group, POD_GROUP_SCHEMA)
    assert group["spec"] == {"minMember": len(inp.plan.learners)}
    assert group["metadata"]["name"] == inp.prefix
    assert group["metadata"]["labels"] == service["labels"]
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("ConfigMap", OWNER.name, OWNER.uid)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda g: g["spec"].update(minMember=0),
        lambda g: g["spec"].update(minMember="2"),
        lambda g: g["spec"].update(minMembers=2),
        lambda g: g.update(apiVersion="scheduling.sigs.k8s.io/v1alpha1"),
    ],
)
def test_the_pod_group_schema_refuses_a_broken_group(break_it: Any) -> None:
    group = pod_group("learner-x", "dlaas", 2, {}, [])
    jsonschema.validate(group, POD_GROUP_SCHEMA)
    break_it(group)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(group, POD_GROUP_SCHEMA)


def test_a_pod_group_of_no_learner_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        pod_group("learner-x", "dlaas", 0, {}, [])


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, GangConfig("none", "dlaas", "scheduler-plugins-scheduler")),
        (
            {"DLAAS_K8S_GANG": "kueue", "DLAAS_K8S_KUEUE_QUEUE": "gpu-queue"},
            GangConfig("kueue", "gpu-queue", "scheduler-plugins-scheduler"),
        ),
        (
            {"DLAAS_K8S_GANG": "coscheduling", "DLAAS_K8S_SCHEDULER_NAME": "gang-scheduler"},
            GangConfig("coscheduling", "dlaas", "gang-scheduler"),
        ),
    ],
)
def test_the_settings_choose_the_gang_scheduler(
    env: dict[str, str], expected: GangConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gang = GangConfig.from_settings(Settings())
    assert gang == expected
    assert gang.admits_without_capacity == (expected.kind != "none")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DLAAS_K8S_GANG", "volcano"),
        ("DLAAS_K8S_KUEUE_QUEUE", "Not_A_Name"),
        ("DLAAS_K8S_UNSCHEDULABLE_SECONDS", "0"),
    ],
)
def test_bad_gang_settings_are_refused_naming_the_setting(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("DLAAS_").lower()):
        Settings()


# -- reading an unschedulable pod ----------------------------------------------------------------

CREATED = "2026-11-24T00:00:00Z"
T0 = datetime(2026, 11, 24, tzinfo=UTC).timestamp()


def learners_env(nodes: int) -> dict[str, str]:
    return {"name": "NUM_LEARNERS", "value": str(nodes)}


def waiting_pod(
    learner: int, conditions: list[dict[str, Any]], attempt: int = 1, nodes: int = 2
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"learner-t-{learner}",
            "creationTimestamp": CREATED,
            "labels": {
                "dlaas.io/learner-id": str(learner),
                "dlaas.io/attempt": str(attempt),
                "dlaas.io/primary": "true",
            },
        },
        "spec": {
            "containers": [
                {"name": "learner", "env": [{"name": "NUM_LEARNERS", "value": str(nodes)}]}
            ]
        },
        "status": {"phase": "Pending", "conditions": conditions},
    }


def scheduled(status: str, reason: str | None = None, at: str | None = None) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": status}
    if reason:
        condition["reason"] = reason
    if at:
        condition["lastTransitionTime"] = at
    return condition


@pytest.mark.parametrize(
    ("conditions", "since"),
    [
        ([scheduled("False", "Unschedulable", "2026-11-24T00:05:00Z")], T0 + 300),
        # No transition time given: since the pod was created.
        ([scheduled("False", "Unschedulable")], T0),
        ([scheduled("True")], None),
        # Held by a gate (Kueue's, until its quota admits the group): not unschedulable.
        ([scheduled("False", "SchedulingGated", "2026-11-24T00:05:00Z")], None),
        ([{"type": "Ready", "status": "False", "reason": "Unschedulable"}], None),
        ([], None),
    ],
)
def test_since_when_a_pod_is_unschedulable(
    conditions: list[dict[str, Any]], since: float | None
) -> None:
    assert pod_states.unschedulable_since(waiting_pod(1, conditions)) == since


def test_the_observation_names_the_unschedulable_learners_of_the_latest_attempt() -> None:
    late = scheduled("False", "Unschedulable", "2026-11-24T00:05:00Z")
    pods = TrainingPods(
        live={
            "a": waiting_pod(1, [scheduled("True")], attempt=2, nodes=3),
            "b": waiting_pod(2, [late], attempt=2, nodes=3),
            "old": waiting_pod(3, [late], attempt=1, nodes=3),
        },
        # Learner 3's pod of attempt 2 is gone: its last state says nothing of now.
        gone={"c": waiting_pod(3, [late], attempt=2, nodes=3)},
    )
    got = observation(pods, T0 + 600, image_pull_timeout=60)
    assert got.attempt == 2
    assert got.unschedulable == (Unschedulable(2, T0 + 300),)
    assert [lo.phase for lo in got.learners] == ["PENDING", "PENDING", "LOST"]
