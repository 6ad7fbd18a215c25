"""What a learner's pod says about the learner (pure: plain dicts as the API returns them).

A pod is read as the API serves it (a watch event's `object`, or
`ApiClient().sanitize_for_serialization(pod)`): the init container `fetch` (DOWNLOADING),
the native sidecar `agent` that stores RESULT_DIR after the run (STORING), and the main
container `learner` whose exit code is the learner's. Everything else a pod can say
(unschedulable, an image that cannot be pulled, out of memory, evicted, deleted, past its
activeDeadlineSeconds) becomes one LearnerObservation the lifecycle already understands.

Pod text (scheduler messages, container reasons, image names) can carry what a tenant
wrote, so every message is cleaned and bounded like a learner's own report.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from service.domain.lifecycle import LearnerObservation
from service.domain.reports import MESSAGE_BYTES, clean_text
from worker.backends.kubernetes import layout
from worker.backends.kubernetes.objects import LEARNER_LABEL

FETCH = layout.FETCH_CONTAINER
AGENT = layout.AGENT_CONTAINER
LEARNER = layout.LEARNER_CONTAINER

# A waiting container's reasons that mean its image cannot be had: retried by the kubelet
# (with back-off) until the pull timeout, then the learner fails naming the image.
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
# Reasons no retry can fix: the learner fails at once, naming the image.
BAD_IMAGE_REASONS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# How the kubelet reports a container the kernel killed for memory, and its exit code.
OOM_REASON = "OOMKilled"
OOM_EXIT_CODE = 137

Pod = Mapping[str, Any]


def learner_observation(
    pod: Pod | None,
    now: float,
    *,
    image_pull_timeout: float,
    deleted: bool = False,
    learner_id: int | None = None,
) -> LearnerObservation:
    """The learner's state from its pod at `now` (epoch seconds).

    `pod` is None when the training had the pod and it is gone (then `learner_id` names
    the learner); `deleted` is True for the last state a watch's DELETED event carried. A
    pod being deleted (`deletionTimestamp` set) or deleted is LOST, unless its learner
    had ended on its own before the deletion was asked for (then that end stands: the
    pods of an ended training are deleted too). `learner_id`, when given, overrides the
    pod's `dlaas.io/learner-id` label.
    """
    lid = learner_id if learner_id is not None else _learner_id(pod)
    if pod is None:
        return LearnerObservation(lid, "LOST", None, f"learner {lid}'s pod was deleted")
    observed = _from_pod(pod, lid, now, image_pull_timeout)
    requested = deletion_requested(pod)
    going = deleted or requested is not None
    if going and (not observed.ended or _killed_by_deletion(pod, requested)):
        return LearnerObservation(
            lid, "LOST", None, f"learner {lid}'s pod was deleted", observed.phases
        )
    return observed


def deletion_requested(pod: Pod) -> float | None:
    """When the pod's deletion was asked for (epoch seconds), or None. The API sets
    `deletionTimestamp` to the end of the grace period, so the grace is taken off."""
    meta = _dict(pod.get("metadata"))
    deadline = parse_time(meta.get("deletionTimestamp"))
    if deadline is None:
        return None
    grace = meta.get("deletionGracePeriodSeconds")
    return deadline - grace if isinstance(grace, int) and not isinstance(grace, bool) else deadline


def _killed_by_deletion(pod: Pod, requested: float | None) -> bool:
    """Whether `fetch` or `learner` ended in failure once the deletion was asked for (the
    kubelet's SIGTERM or SIGKILL, not the learner's own end)."""
    if requested is None:
        return False
    for name in (FETCH, LEARNER):
        end = _dict(_dict(container_status(pod, name).get("state")).get("terminated"))
        finished = parse_time(end.get("finishedAt"))
        if finished is not None and finished >= requested and end.get("exitCode") != 0:
            return True
    return False


def _from_pod(pod: Pod, lid: int, now: float, image_pull_timeout: float) -> LearnerObservation:
    status = _dict(pod.get("status"))
    phases = phase_times(pod)
    reason = _str(status.get("reason"))
    pod_message = _str(status.get("message"))

    if reason == "Evicted":
        return LearnerObservation(
            lid, "LOST", None, _message(f"learner {lid}'s pod was evicted", pod_message), phases
        )
    if reason == "DeadlineExceeded":
        deadline = _dict(pod.get("spec")).get("activeDeadlineSeconds")
        limit = f" ({deadline} s)" if isinstance(deadline, int) else ""
        return LearnerObservation(
            lid,
            "FAILED",
            None,
            f"learner {lid} was stopped: it ran longer than max_runtime{limit}",
            phases,
        )

    learner = container_status(pod, LEARNER)
    terminated = _dict(_dict(learner.get("state")).get("terminated"))
    if terminated:
        return _after_run(pod, lid, terminated, phases)
    if _dict(_dict(learner.get("state")).get("running")):
        return LearnerObservation(lid, "RUNNING", None, None, phases)

    image_problem = _image_problem(pod, lid, now, image_pull_timeout, phases)
    if image_problem is not None:
        return image_problem

    fetch = container_status(pod, FETCH)
    fetch_state = _dict(fetch.get("state"))
    fetch_end = _dict(fetch_state.get("terminated"))
    fetch_code = fetch_end.get("exitCode")
    if fetch_end and fetch_code != 0:
        return LearnerObservation(
            lid,
            "FAILED",
            None,  # not the user's command: its exit code is no learner's exit code
            _message(
                f"learner {lid} could not fetch its code or data (exit code {fetch_code})",
                _str(fetch_end.get("message")) or _str(fetch_end.get("reason")),
            ),
            phases,
        )
    if _str(status.get("phase")) == "Failed":
        # Failed before the learner ran, with no container to blame: the node went away,
        # the kubelet refused the pod, the node shut down.
        return LearnerObservation(
            lid,
            "LOST",
            None,
            _message(f"learner {lid}'s pod failed ({reason or 'no reason given'})", pod_message),
            phases,
        )
    if _dict(fetch_state.get("running")) or fetch_end:
        return LearnerObservation(lid, "DOWNLOADING", None, None, phases)

    unschedulable = _unschedulable(status)
    if unschedulable is not None:
        return LearnerObservation(lid, "PENDING", None, unschedulable, phases)
    waiting = _waiting_problem(pod)
    return LearnerObservation(lid, "PENDING", None, waiting, phases)


def _after_run(
    pod: Pod, lid: int, terminated: Mapping[str, Any], phases: tuple[tuple[str, float], ...]
) -> LearnerObservation:
    code = terminated.get("exitCode")
    reason = _str(terminated.get("reason"))
    if reason == OOM_REASON:
        return LearnerObservation(
            lid,
            "FAILED",
            OOM_EXIT_CODE,
            f"learner {lid} was killed: out of memory ({OOM_REASON})",
            phases,
        )
    if not isinstance(code, int):
        return LearnerObservation(
            lid, "FAILED", None, f"learner {lid} ended without an exit code", phases
        )
    if code != 0:
        # The learner container's termination message, when its `run` step failed (not
        # the command: results not stored, peers unreachable, a command that cannot start).
        detail = _str(terminated.get("message")) or (
            reason if reason not in (None, "Error") else None
        )
        return LearnerObservation(
            lid, "FAILED", code, _message(f"learner {lid} exited with code {code}", detail), phases
        )
    agent_state = _dict(container_status(pod, AGENT).get("state"))
    agent_end = _dict(agent_state.get("terminated"))
    pod_phase = _str(_dict(pod.get("status")).get("phase"))
    if agent_end:
        agent_code = agent_end.get("exitCode")
        if agent_code == 0 or pod_phase == "Succeeded":
            return LearnerObservation(lid, "COMPLETED", 0, None, phases)
        return LearnerObservation(
            lid,
            "FAILED",
            None,
            f"learner {lid} exited 0 but its results could not be stored "
            f"(the agent exited with code {agent_code})",
            phases,
        )
    if pod_phase == "Succeeded":
        return LearnerObservation(lid, "COMPLETED", 0, None, phases)
    return LearnerObservation(lid, "STORING", None, None, phases)


def _image_problem(
    pod: Pod, lid: int, now: float, timeout: float, phases: tuple[tuple[str, float], ...]
) -> LearnerObservation | None:
    """FAILED naming the image once a container has waited for it past `timeout`, or at
    once when no retry can fix it; PENDING with the kubelet's words before. The wait is
    measured from the pod alone (no memory of when it was first seen): from the last thing
    that happened in it, its creation or a container's start or end, since a container's
    image is pulled only once those before it are done."""
    for name, cstatus in _all_container_statuses(pod):
        waiting = _dict(_dict(cstatus.get("state")).get("waiting"))
        reason = _str(waiting.get("reason"))
        if reason not in IMAGE_PULL_REASONS and reason not in BAD_IMAGE_REASONS:
            continue
        image = _str(cstatus.get("image")) or _spec_image(pod, name) or "(unknown image)"
        detail = _str(waiting.get("message"))
        since = _last_event(pod)
        waited = None if since is None else now - since
        if reason in BAD_IMAGE_REASONS or (waited is not None and waited >= timeout):
            return LearnerObservation(
                lid,
                "FAILED",
                None,
                _message(f"learner {lid} could not pull image {image} ({reason})", detail),
                phases,
            )
        return LearnerObservation(
            lid, "PENDING", None, _message(f"pulling image {image} ({reason})", detail), phases
        )
    return None


def _unschedulable(status: Mapping[str, Any]) -> str | None:
    for condition in _list(status.get("conditions")):
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return _message("unschedulable", _str(condition.get("message")))
    return None


def unschedulable_since(pod: Pod) -> float | None:
    """Since when (epoch seconds) the scheduler could not place the pod, from its
    `PodScheduled` condition (False, reason `Unschedulable`, its lastTransitionTime); None
    when it is placed, or not said to be unplaceable."""
    status = _dict(pod.get("status"))
    for condition in _list(status.get("conditions")):
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            since = parse_time(condition.get("lastTransitionTime"))
            if since is None:  # no time given: since the pod was created
                since = parse_time(_dict(pod.get("metadata")).get("creationTimestamp"))
            return since
    return None


def _waiting_problem(pod: Pod) -> str | None:
    """What keeps a pod's containers from starting, when it is more than their creation
    (a missing Secret or ConfigMap: CreateContainerConfigError, and the like)."""
    for name, cstatus in _all_container_statuses(pod):
        waiting = _dict(_dict(cstatus.get("state")).get("waiting"))
        reason = _str(waiting.get("reason"))
        if reason and reason not in ("ContainerCreating", "PodInitializing"):
            return _message(f"container {name} is waiting ({reason})", _str(waiting.get("message")))
    return None


def phase_times(pod: Pod) -> tuple[tuple[str, float], ...]:
    """When the learner entered each phase, from the containers' startedAt and finishedAt:
    DOWNLOADING when `fetch` started, RUNNING when `learner` started, STORING when it
    finished with exit 0, COMPLETED when the agent finished storing."""
    out: list[tuple[str, float]] = []
    created = parse_time(_dict(pod.get("metadata")).get("creationTimestamp"))
    if created is not None:
        out.append(("PENDING", created))
    fetch_started = _started(container_status(pod, FETCH))
    if fetch_started is not None:
        out.append(("DOWNLOADING", fetch_started))
    learner = container_status(pod, LEARNER)
    learner_started = _started(learner)
    if learner_started is not None:
        out.append(("RUNNING", learner_started))
    end = _dict(_dict(learner.get("state")).get("terminated"))
    finished = parse_time(end.get("finishedAt"))
    if end.get("exitCode") == 0 and finished is not None:
        out.append(("STORING", finished))
        agent_end = _dict(_dict(container_status(pod, AGENT).get("state")).get("terminated"))
        stored = parse_time(agent_end.get("finishedAt"))
        if stored is not None and agent_end.get("exitCode") == 0:
            out.append(("COMPLETED", stored))
    return tuple(out)


def container_status(pod: Pod, name: str) -> Mapping[str, Any]:
    """The status of the (init or main) container `name`, or {} before the kubelet has one."""
    for found, cstatus in _all_container_statuses(pod):
        if found == name:
            return cstatus
    return {}


def parse_time(value: object) -> float | None:
    """An API timestamp (RFC 3339, e.g. `2026-11-24T00:38:37Z`) as epoch seconds."""
    if isinstance(value, datetime):
        return value.timestamp()
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def _last_event(pod: Pod) -> float | None:
    times = [parse_time(_dict(pod.get("metadata")).get("creationTimestamp"))]
    for _, cstatus in _all_container_statuses(pod):
        for state in _dict(cstatus.get("state")).values():
            state = _dict(state)
            times += [parse_time(state.get("startedAt")), parse_time(state.get("finishedAt"))]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _started(cstatus: Mapping[str, Any]) -> float | None:
    state = _dict(cstatus.get("state"))
    for key in ("running", "terminated"):
        started = parse_time(_dict(state.get(key)).get("startedAt"))
        if started is not None:
            return started
    return None


def _all_container_statuses(pod: Pod) -> Iterator[tuple[str, Mapping[str, Any]]]:
    status = _dict(pod.get("status"))
    for key in ("initContainerStatuses", "containerStatuses"):
        for cstatus in _list(status.get(key)):
            name = cstatus.get("name")
            if isinstance(name, str):
                yield name, cstatus


def _spec_image(pod: Pod, name: str) -> str | None:
    spec = _dict(pod.get("spec"))
    for key in ("initContainers", "containers"):
        for container in _list(spec.get(key)):
            if container.get("name") == name:
                return _str(container.get("image"))
    return None


def _learner_id(pod: Pod | None) -> int:
    labels = _dict(_dict(pod.get("metadata") if pod is not None else None).get("labels"))
    value = labels.get(LEARNER_LABEL)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ValueError(f"the pod has no {LEARNER_LABEL} label and no learner id was given")


def _message(head: str, detail: str | None) -> str:
    text = f"{head}: {detail}" if detail else head
    return clean_text(text, MESSAGE_BYTES)


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
