"""The local backend's learners as processes and files: which processes belong to a
learner (whatever its status file says), what its status file says of it, and the
backend's small JSON files (state.json, ranks.json) written whole. A status file is the
learner's own report: read bounded, every field checked, a pid believed only for a process
that is the learner's wrapper or command."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from service.domain.lifecycle import LearnerObservation

# A learner whose wrapper has not reported within this many seconds never started.
START_TIMEOUT = 60.0


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


_MAX_STATE_BYTES = 1024 * 1024  # a status or state file is a few hundred bytes


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_STATE_BYTES + 1)
        if len(raw) > _MAX_STATE_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def belongs(pid: object, training_id: str, spec_path: Path) -> bool:
    """Whether `pid` (from a status file: untrusted) is a live process of this learner:
    its wrapper (whose command line names the spec) or its command (whose environment
    names the training). Anything else, another training's process included, is not."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not 1 < pid < 2**22:
        return False
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if str(spec_path).encode() in cmdline:
            return True
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"TRAINING_ID={training_id}".encode() in environ


def phase_times(value: object) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        return ()
    out = []
    for k, v in value.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out.append((str(k), float(v)))
    return tuple(out)


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def wrapper_started(spec_path: Path) -> bool:
    """Whether the learner's wrapper was started: it reported a status, or a live
    process names its spec (the wrapper, or `setsid` about to become it)."""
    if spec_path.with_name("status.json").exists():
        return True
    needle = str(spec_path).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in cmdline and pid_alive(int(entry)):
            return True
    return False


def observe_learner(training_id: str, learner: dict[str, Any], now: float) -> LearnerObservation:
    lid = int(learner["learner_id"])
    spec_path = Path(learner["spec"])
    status = read_json(spec_path.with_name("status.json"))
    if status is None:
        spawned = learner["spawned_at"]
        if spawned is not None and now - spawned > START_TIMEOUT:
            return LearnerObservation(lid, "LOST", None, f"learner {lid} did not start")
        return LearnerObservation(lid, "PENDING")
    phase = str(status.get("phase"))
    exit_code = status.get("exit_code")
    message = status.get("message")
    phases = phase_times(status.get("phases"))
    if phase in ("COMPLETED", "FAILED", "HALTED"):
        return LearnerObservation(lid, phase, exit_code, message, phases)
    if not belongs(status.get("pid"), training_id, spec_path):
        return LearnerObservation(lid, "LOST", None, f"learner {lid} stopped reporting (lost)")
    return LearnerObservation(lid, phase, exit_code, message, phases)


def process_groups(training_id: str, state: dict[str, Any]) -> list[int]:
    """The process groups of the training's wrappers and commands: only processes that
    belong to it, whatever a status file says."""
    groups: list[int] = []
    for learner in state["learners"]:
        spec_path = Path(learner["spec"])
        status = read_json(spec_path.with_name("status.json")) or {}
        for key in ("pid", "child_pid"):
            pid = status.get(key)
            if belongs(pid, training_id, spec_path):
                assert isinstance(pid, int)
                groups.append(pid)
    return groups


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return pid_alive(pgid)
