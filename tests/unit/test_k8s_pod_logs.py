"""When a learner's pod logs are its log (the agent never ran or could not send), and how
they become log lines; table-driven, pods shaped as the kubelet reports them."""

from __future__ import annotations

from typing import Any

import pytest

from service.storage import keys
from worker.backends.kubernetes.pod_logs import (
    LINE_BYTES,
    POD_LOG_BYTES,
    containers_to_read,
    log_lines,
)

RUN = {"running": {"startedAt": "2026-11-24T00:00:00Z"}}
INIT = {"waiting": {"reason": "PodInitializing"}}
PULL = {"waiting": {"reason": "ErrImagePull", "message": "not found"}}


def ended(code: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}}


def pod(fetch: dict[str, Any], agent: dict[str, Any] | None, learner: dict[str, Any]) -> Any:
    init = [{"name": "fetch", "state": fetch}]
    if agent is not None:
        init.append({"name": "agent", "state": agent})
    return {
        "metadata": {"name": "p-1", "labels": {"dlaas.io/learner-id": "1"}},
        "status": {
            "initContainerStatuses": init,
            "containerStatuses": [{"name": "learner", "state": learner}],
        },
    }


@pytest.mark.parametrize(
    ("fetch", "agent", "learner", "read"),
    [
        # The agent sends (or sent) the learner's output itself.
        (ended(0), RUN, RUN, ()),
        (ended(0), ended(0), ended(1), ()),
        (ended(0), ended(143), ended(143), ()),
        # fetch failed: the agent never started.
        (ended(2), INIT, INIT, ("fetch",)),
        # The agent's image could not be pulled.
        (ended(0), PULL, INIT, ("fetch",)),
        # No status for the agent yet (fetch still running when the pod is stopped).
        (RUN, None, INIT, ("fetch",)),
        # The agent could not work (the wrapper's platform error): nothing was sent.
        (ended(0), ended(2), ended(1), ("fetch", "agent", "learner")),
        # Nothing ran: nothing to read.
        (PULL, None, INIT, ()),
    ],
)
def test_which_containers_logs_are_read(
    fetch: dict[str, Any], agent: dict[str, Any] | None, learner: dict[str, Any], read: Any
) -> None:
    assert containers_to_read(pod(fetch, agent, learner)) == read


def test_a_restarted_agent_that_ran_before_counts_as_ran() -> None:
    p = pod(ended(0), PULL, INIT)
    p["status"]["initContainerStatuses"][1]["lastState"] = ended(2)
    assert containers_to_read(p) == ("fetch", "agent")


def test_log_lines_are_cleaned_and_cut() -> None:
    data = b"ok\r\n\x1b[1mbold\x1b[0m\n\xff\xfebad utf-8\n" + b"y" * (LINE_BYTES + 10)
    lines = log_lines("fetch", data, cut=True)
    assert lines[0] == "[dlaas] the pod log of its fetch container:"
    assert lines[1:4] == ["ok", "[1mbold[0m", "\ufffd\ufffdbad utf-8"]
    assert len(lines[4].encode()) == LINE_BYTES and lines[4].endswith("…")
    assert lines[5] == f"[dlaas] the pod log was cut at {POD_LOG_BYTES} bytes"
    assert log_lines("learner", b"", cut=False) == ["[dlaas] the pod log of its learner container:"]


@pytest.mark.parametrize(
    ("relative", "learner", "part"),
    [
        # Saved per learner (Kubernetes): each restores its own part, or nothing.
        (["learner-1/a", "learner-2/b"], 2, "p/learner-2/"),
        (["learner-1/a"], 2, "p/learner-2/"),
        # Saved as one shared CHECKPOINT_DIR (local): every learner restores the whole.
        (["model.ckpt", "sub/learner-1.idx", "learner-x/y"], 2, "p/"),
        ([], 1, "p/"),
    ],
)
def test_which_part_of_saved_checkpoints_a_learner_restores(
    relative: list[str], learner: int, part: str
) -> None:
    assert keys.checkpoints_of_learner("p/", relative, learner) == part
