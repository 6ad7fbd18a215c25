"""A learner's pod, as the API serves it, read as the learner's state; table-driven.

The pods are shaped like the kubelet reports them (status.conditions, initContainerStatuses
for `fetch` and the native sidecar `agent`, containerStatuses for `learner`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.domain.reports import MESSAGE_BYTES
from worker.backends.kubernetes.pod_states import learner_observation, parse_time, phase_times

T0 = datetime(2026, 11, 24, 0, 0, tzinfo=UTC)
IMAGE = "registry.example.com/dlaas/learner-tensorflow:2.21"
PULL_TIMEOUT = 300.0


def ts(seconds: float) -> str:
    """An API timestamp `seconds` after T0, as the API writes it."""
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def at(seconds: float) -> float:
    return (T0 + timedelta(seconds=seconds)).timestamp()


def waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"reason": reason}
    if message is not None:
        state["message"] = message
    return {"waiting": state}


def running(started: float) -> dict[str, Any]:
    return {"running": {"startedAt": ts(started)}}


def terminated(
    code: int,
    started: float,
    finished: float,
    reason: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    reason = reason or ("Completed" if code == 0 else "Error")
    state = {
        "exitCode": code,
        "reason": reason,
        "startedAt": ts(started),
        "finishedAt": ts(finished),
        "containerID": "containerd://0f3a",
    }
    if message is not None:
        state["message"] = message
    return {"terminated": state}


def cstatus(name: str, state: dict[str, Any], image: str = IMAGE) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": "running" in state,
        "restartCount": 0,
        "started": "running" in state,
        "state": state,
    }


def pod(
    phase: str = "Pending",
    *,
    fetch: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
    learner: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    reason: str | None = None,
    message: str | None = None,
    learner_id: int = 2,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "qosClass": "Guaranteed"}
    if conditions is not None:
        status["conditions"] = conditions
    if reason is not None:
        status["reason"] = reason
    if message is not None:
        status["message"] = message
    inits = [cstatus(n, s) for n, s in (("fetch", fetch), ("agent", agent)) if s is not None]
    if inits:
        status["initContainerStatuses"] = inits
    if learner is not None:
        status["containerStatuses"] = [cstatus("learner", learner)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"training-abc-{learner_id}",
            "namespace": "dlaas",
            "creationTimestamp": ts(0),
            "labels": {
                "dlaas.io/training-id": "training-abc",
                "dlaas.io/tenant": "acme",
                "dlaas.io/learner-id": str(learner_id),
            },
        },
        "spec": {
            "activeDeadlineSeconds": 3600,
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "fetch", "image": IMAGE},
                {"name": "agent", "image": IMAGE, "restartPolicy": "Always"},
            ],
            "containers": [{"name": "learner", "image": IMAGE}],
        },
        "status": status,
    }


UNSCHEDULABLE = [
    {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "lastTransitionTime": ts(1),
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found.",
    }
]
SCHEDULED = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(1)}]
PULL_MESSAGE = f'Back-off pulling image "{IMAGE}"'


CASES: list[tuple[str, dict[str, Any], float, str, int | None, str | None]] = [
    # (case, pod, now in seconds after creation, phase, exit code, words in the message)
    ("just created", pod(), 1, "PENDING", None, None),
    (
        "unschedulable: the scheduler's message",
        pod(conditions=UNSCHEDULABLE),
        30,
        "PENDING",
        None,
        "3 Insufficient nvidia.com/gpu",
    ),
    (
        "scheduled, containers being created",
        pod(conditions=SCHEDULED, fetch=waiting("PodInitializing")),
        3,
        "PENDING",
        None,
        None,
    ),
    (
        "fetch running",
        pod(
            conditions=SCHEDULED,
            fetch=running(5),
            agent=waiting("PodInitializing"),
            learner=waiting("PodInitializing"),
        ),
        6,
        "DOWNLOADING",
        None,
        None,
    ),
    (
        "fetch done, learner starting",
        pod(
            conditions=SCHEDULED,
            fetch=terminated(0, 5, 20),
            agent=running(21),
            learner=waiting("ContainerCreating"),
        ),
        22,
        "DOWNLOADING",
        None,
        None,
    ),
    (
        "fetch failed",
        pod(
            "Failed",
            conditions=SCHEDULED,
            fetch=terminated(3, 5, 9),
            learner=waiting("PodInitializing"),
        ),
        10,
        "FAILED",
        None,
        "could not fetch its code or data (exit code 3)",
    ),
    (
        "learner running",
        pod(
            "Running",
            conditions=SCHEDULED,
            fetch=terminated(0, 5, 20),
            agent=running(21),
            learner=running(22),
        ),
        30,
        "RUNNING",
        None,
        None,
    ),
    (
        "learner exited 0, agent storing",
        pod(
            "Running",
            fetch=terminated(0, 5, 20),
            agent=running(21),
            learner=terminated(0, 22, 100),
        ),
        101,
        "STORING",
        None,
        None,
    ),
    (
        "learner exited 0, agent stored",
        pod(
            "Succeeded",
            fetch=terminated(0, 5, 20),
            agent=terminated(0, 21, 110),
            learner=terminated(0, 22, 100),
        ),
        111,
        "COMPLETED",
        0,
        None,
    ),
    (
        "learner exited 0, pod succeeded",
        pod("Succeeded", fetch=terminated(0, 5, 20), learner=terminated(0, 22, 100)),
        111,
        "COMPLETED",
        0,
        None,
    ),
    (
        "learner exited 0, the agent could not store",
        pod(
            "Running",
            fetch=terminated(0, 5, 20),
            agent=terminated(2, 21, 110),
            learner=terminated(0, 22, 100),
        ),
        111,
        "FAILED",
        None,
        "results could not be stored (the agent exited with code 2)",
    ),
    (
        "learner exited non-zero: its exit code",
        pod(
            "Failed",
            fetch=terminated(0, 5, 20),
            agent=terminated(0, 21, 60),
            learner=terminated(42, 22, 50),
        ),
        61,
        "FAILED",
        42,
        "learner 2 exited with code 42",
    ),
    (
        "learner's run step failed: its termination message says why",
        pod(
            "Failed",
            fetch=terminated(0, 5, 20),
            agent=terminated(0, 21, 60),
            learner=terminated(
                122,
                22,
                50,
                message="learner 2: the other learners did not accept connections within "
                "300 s; still missing: t-1:2022",
            ),
        ),
        61,
        "FAILED",
        122,
        "learner 2 exited with code 122: learner 2: the other learners did not accept",
    ),
    (
        "OOMKilled",
        pod(
            "Failed",
            fetch=terminated(0, 5, 20),
            agent=terminated(0, 21, 60),
            learner=terminated(137, 22, 50, reason="OOMKilled"),
        ),
        61,
        "FAILED",
        137,
        "learner 2 was killed: out of memory (OOMKilled)",
    ),
    (
        "image pull back-off before the timeout: pending with the kubelet's words",
        pod(conditions=SCHEDULED, fetch=waiting("ImagePullBackOff", PULL_MESSAGE)),
        PULL_TIMEOUT - 1,
        "PENDING",
        None,
        f"pulling image {IMAGE} (ImagePullBackOff): Back-off pulling image",
    ),
    (
        "image pull back-off past the timeout: failed naming the image",
        pod(conditions=SCHEDULED, fetch=waiting("ImagePullBackOff", PULL_MESSAGE)),
        PULL_TIMEOUT + 1,
        "FAILED",
        None,
        f"learner 2 could not pull image {IMAGE} (ImagePullBackOff)",
    ),
    (
        "ErrImagePull on the main container: waited from the sidecar's start",
        pod(
            conditions=SCHEDULED,
            fetch=terminated(0, 5, 20),
            agent=running(21),
            learner=waiting("ErrImagePull", "rpc error: not found"),
        ),
        PULL_TIMEOUT + 20,
        "PENDING",
        None,
        f"pulling image {IMAGE} (ErrImagePull): rpc error: not found",
    ),
    (
        "ErrImagePull on the main container past the timeout",
        pod(
            conditions=SCHEDULED,
            fetch=terminated(0, 5, 20),
            agent=running(21),
            learner=waiting("ErrImagePull", "rpc error: not found"),
        ),
        PULL_TIMEOUT + 21,
        "FAILED",
        None,
        f"could not pull image {IMAGE} (ErrImagePull): rpc error: not found",
    ),
    (
        "an invalid image name fails at once",
        pod(conditions=SCHEDULED, fetch=waiting("InvalidImageName", "couldn't parse")),
        2,
        "FAILED",
        None,
        "(InvalidImageName)",
    ),
    (
        "a missing secret: pending, saying so",
        pod(
            conditions=SCHEDULED,
            fetch=waiting("CreateContainerConfigError", 'secret "training-abc" not found'),
        ),
        10,
        "PENDING",
        None,
        'container fetch is waiting (CreateContainerConfigError): secret "training-abc"',
    ),
    (
        "evicted: lost",
        pod(
            "Failed",
            reason="Evicted",
            message="The node was low on resource: memory. Threshold quantity: 100Mi.",
            fetch=terminated(0, 5, 20),
            learner=terminated(137, 22, 50),
        ),
        61,
        "LOST",
        None,
        "learner 2's pod was evicted: The node was low on resource: memory.",
    ),
    (
        "activeDeadlineSeconds exceeded",
        pod(
            "Failed",
            reason="DeadlineExceeded",
            message="Pod was active on the node longer than the specified deadline",
            fetch=terminated(0, 5, 20),
            learner=terminated(137, 22, 3605),
        ),
        3606,
        "FAILED",
        None,
        "ran longer than max_runtime (3600 s)",
    ),
    (
        "failed before running, no container to blame (node lost)",
        pod("Failed", reason="NodeLost", message="node n1 which was running pod is unresponsive"),
        100,
        "LOST",
        None,
        "learner 2's pod failed (NodeLost): node n1",
    ),
]


@pytest.mark.parametrize(
    ("pod_", "now", "phase", "code", "words"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_pod_to_learner_state(
    pod_: dict[str, Any], now: float, phase: str, code: int | None, words: str | None
) -> None:
    obs = learner_observation(pod_, at(now), image_pull_timeout=PULL_TIMEOUT)
    assert obs.learner_id == 2
    assert (obs.phase, obs.exit_code) == (phase, code)
    if words is None:
        assert obs.message is None
    else:
        assert obs.message is not None
        assert words in obs.message


def test_deleted_while_running_is_lost() -> None:
    running_pod = pod("Running", fetch=terminated(0, 5, 20), learner=running(22))
    obs = learner_observation(running_pod, at(30), image_pull_timeout=PULL_TIMEOUT, deleted=True)
    assert (obs.phase, obs.message) == ("LOST", "learner 2's pod was deleted")
    assert dict(obs.phases)["RUNNING"] == at(22)


def test_deleted_after_it_ended_keeps_the_end() -> None:
    done = pod(
        "Succeeded",
        fetch=terminated(0, 5, 20),
        agent=terminated(0, 21, 110),
        learner=terminated(0, 22, 100),
    )
    obs = learner_observation(done, at(200), image_pull_timeout=PULL_TIMEOUT, deleted=True)
    assert (obs.phase, obs.exit_code) == ("COMPLETED", 0)
    failed = pod("Failed", fetch=terminated(0, 5, 20), learner=terminated(1, 22, 50))
    obs = learner_observation(failed, at(200), image_pull_timeout=PULL_TIMEOUT, deleted=True)
    assert (obs.phase, obs.exit_code) == ("FAILED", 1)


def being_deleted(p: dict[str, Any], asked: float, grace: int = 30) -> dict[str, Any]:
    """The pod once its deletion was asked for at `asked`: the API writes the end of the
    grace period."""
    p["metadata"]["deletionTimestamp"] = ts(asked + grace)
    p["metadata"]["deletionGracePeriodSeconds"] = grace
    return p


def test_a_pod_being_deleted_while_it_runs_is_lost() -> None:
    still_running = being_deleted(
        pod("Running", fetch=terminated(0, 5, 20), agent=running(21), learner=running(22)), 40
    )
    obs = learner_observation(still_running, at(41), image_pull_timeout=PULL_TIMEOUT)
    assert (obs.phase, obs.exit_code) == ("LOST", None)
    # The kubelet's SIGTERM ends the learner with 143: still the deletion, not a failure.
    killed = being_deleted(
        pod("Failed", fetch=terminated(0, 5, 20), learner=terminated(143, 22, 45)), 40
    )
    obs = learner_observation(killed, at(46), image_pull_timeout=PULL_TIMEOUT)
    assert (obs.phase, obs.message) == ("LOST", "learner 2's pod was deleted")


def test_a_failure_before_the_deletion_stands() -> None:
    failed_first = being_deleted(
        pod("Failed", fetch=terminated(0, 5, 20), learner=terminated(1, 22, 30)), 40
    )
    for deleted in (False, True):
        obs = learner_observation(
            failed_first, at(41), image_pull_timeout=PULL_TIMEOUT, deleted=deleted
        )
        assert (obs.phase, obs.exit_code) == ("FAILED", 1)


def test_a_pod_gone_from_the_cluster_is_lost() -> None:
    obs = learner_observation(None, at(10), image_pull_timeout=PULL_TIMEOUT, learner_id=3)
    assert (obs.learner_id, obs.phase, obs.message) == (3, "LOST", "learner 3's pod was deleted")
    with pytest.raises(ValueError, match="learner-id"):
        learner_observation(None, at(10), image_pull_timeout=PULL_TIMEOUT)


def test_phase_times_from_container_times() -> None:
    done = pod(
        "Succeeded",
        fetch=terminated(0, 5, 20),
        agent=terminated(0, 21, 110),
        learner=terminated(0, 22, 100),
    )
    assert phase_times(done) == (
        ("PENDING", at(0)),
        ("DOWNLOADING", at(5)),
        ("RUNNING", at(22)),
        ("STORING", at(100)),
        ("COMPLETED", at(110)),
    )
    # A failed learner never stored: no STORING, no COMPLETED.
    failed = pod("Failed", fetch=terminated(0, 5, 20), learner=terminated(1, 22, 50))
    assert [p for p, _ in phase_times(failed)] == ["PENDING", "DOWNLOADING", "RUNNING"]
    obs = learner_observation(done, at(111), image_pull_timeout=PULL_TIMEOUT)
    assert obs.phases == phase_times(done)


def test_messages_from_the_pod_are_cleaned_and_bounded() -> None:
    noisy = "0/3 nodes\x1b[31m are \u202eavailable" + "x" * (MESSAGE_BYTES * 2)
    conditions = [{**UNSCHEDULABLE[0], "message": noisy}]
    obs = learner_observation(pod(conditions=conditions), at(5), image_pull_timeout=PULL_TIMEOUT)
    assert obs.message is not None
    assert obs.message.startswith("unschedulable: 0/3 nodes[31m are available")
    assert len(obs.message.encode()) <= MESSAGE_BYTES
    assert obs.message.endswith("…")


def test_sanitized_client_timestamps_parse() -> None:
    # sanitize_for_serialization writes datetimes with isoformat(): +00:00, not Z.
    assert parse_time("2026-11-24T00:00:05+00:00") == at(5)
    assert parse_time(ts(5)) == at(5)
    assert parse_time(T0 + timedelta(seconds=5)) == at(5)
    assert parse_time("not a time") is None
    assert parse_time("2026-11-24T00:00:05") is None  # no zone: not the API's


def test_learner_id_from_the_label() -> None:
    obs = learner_observation(pod(learner_id=7), at(1), image_pull_timeout=PULL_TIMEOUT)
    assert obs.learner_id == 7
