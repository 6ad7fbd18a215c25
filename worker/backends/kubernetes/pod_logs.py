"""The pod log API as the fallback for a learner's log (pure).

A learner's output reaches the log store through its pod's agent (worker.learner.pod_steps).
Where the agent never ran (fetch failed before it, its image could not be pulled) or could
not send (it ended with the wrapper's platform-error code: no log store to send to), what
the pod's containers said is only in the kubelet's logs, which the API serves
(`pods/log`). This module decides from a pod's container states which containers to read
and turns what they said into log lines: untrusted text (the learner container runs the
user's code), cleaned and cut at a byte cap per learner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.domain.reports import clean_text
from worker.backends.kubernetes import layout, pod_states

Pod = Mapping[str, Any]

# What the fallback keeps of one learner's pod: its containers' logs together.
POD_LOG_BYTES = 64 * 1024
# A line longer than this is cut (with "…"), as the log tee cuts none shorter.
LINE_BYTES = 16 * 1024
# The agent's exit code when it cannot work at all (worker.learner.pod_steps).
AGENT_PLATFORM_ERROR = 2

_CONTAINERS = (layout.FETCH_CONTAINER, layout.AGENT_CONTAINER, layout.LEARNER_CONTAINER)


def _ran(cstatus: Mapping[str, Any]) -> bool:
    """Whether the container started (and so may have a log)."""
    states = [cstatus.get("state") or {}, cstatus.get("lastState") or {}]
    return any("running" in s or "terminated" in s for s in states if isinstance(s, Mapping))


def agent_sent(pod: Pod) -> bool:
    """Whether the pod's agent ran and could send the learner's output: it runs, or it
    ended other than with the platform-error code."""
    state = pod_states.container_status(pod, layout.AGENT_CONTAINER).get("state") or {}
    if "running" in state:
        return True
    terminated = state.get("terminated")
    return isinstance(terminated, Mapping) and terminated.get("exitCode") != AGENT_PLATFORM_ERROR


def containers_to_read(pod: Pod) -> tuple[str, ...]:
    """The containers whose pod log is the only record of what they said: none while the
    agent sends (or has sent) the learner's output; else every one that ran, in order."""
    if agent_sent(pod):
        return ()
    return tuple(c for c in _CONTAINERS if _ran(pod_states.container_status(pod, c)))


def log_lines(container: str, data: bytes, *, cut: bool) -> list[str]:
    """A container's log as cleaned lines, after one that says where they come from (and
    one that says they were cut at the cap)."""
    text = data.decode("utf-8", errors="replace")
    lines = [f"[dlaas] the pod log of its {container} container:"]
    lines += [clean_text(line, LINE_BYTES) for line in text.splitlines()]
    if cut:
        lines.append(f"[dlaas] the pod log was cut at {POD_LOG_BYTES} bytes")
    return lines
