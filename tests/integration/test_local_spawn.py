"""The local backend's start is idempotent even when a worker died between spawning a
learner and recording that it did: the learner is never started twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker.backends.local import LocalBackend
from worker.backends.netns import LearnerNetwork, namespaces_available

pytestmark = pytest.mark.integration


def _state(tmp_path: Path, training_id: str) -> tuple[LocalBackend, Path, Path]:
    """A backend whose training `training_id` has one learner, recorded as never spawned
    (as a worker killed right after spawning it left it)."""
    backend = LocalBackend(tmp_path / "work", use_namespaces=False, use_sandbox=False)
    tdir = tmp_path / "work" / training_id
    ldir = tdir / "learner-1"
    ldir.mkdir(parents=True)
    spec = ldir / "spec.json"
    state = {
        "training_id": training_id,
        "namespaces": False,
        "sandboxed": False,
        "primaries": [1],
        "notes": [],
        "learners": [
            {
                "learner_id": 1,
                "role": "worker",
                "primary": True,
                "spec": str(spec),
                "spawned_at": None,
            }
        ],
    }
    (tdir / "state.json").write_text(json.dumps(state))
    return backend, tdir, spec


def _start(backend: LocalBackend, training_id: str) -> None:
    request: Any = SimpleNamespace(spec=SimpleNamespace(training_id=training_id))
    backend.start(request)


def _spawned_at(tdir: Path) -> float | None:
    value: float | None = json.loads((tdir / "state.json").read_text())["learners"][0]["spawned_at"]
    return value


def test_a_running_learner_not_recorded_as_spawned_is_not_spawned_again(tmp_path: Path) -> None:
    backend, tdir, spec = _state(tmp_path, "t-running")
    # The learner the killed worker started: a process that names its spec.
    learner = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(spec), "host.json"]
    )
    try:
        # Start only once the process has become that learner (the fork runs the
        # test's own command line until its exec), as it long has after a worker died.
        cmdline = Path(f"/proc/{learner.pid}/cmdline")
        deadline = time.monotonic() + 20
        while str(spec).encode() not in cmdline.read_bytes():
            assert time.monotonic() < deadline, "the learner process never started"
            time.sleep(0.01)
        _start(backend, "t-running")
    finally:
        learner.kill()
        learner.wait()
    assert _spawned_at(tdir) is not None
    assert not (spec.parent / "wrapper.log").exists()  # no second wrapper was started


def test_an_ended_learner_not_recorded_as_spawned_is_not_spawned_again(tmp_path: Path) -> None:
    backend, tdir, spec = _state(tmp_path, "t-ended")
    (spec.parent / "status.json").write_text(json.dumps({"phase": "COMPLETED", "exit_code": 0}))
    _start(backend, "t-ended")
    assert _spawned_at(tdir) is not None
    assert not (spec.parent / "wrapper.log").exists()


def test_a_learner_never_spawned_is_spawned(tmp_path: Path) -> None:
    backend, tdir, spec = _state(tmp_path, "t-new")
    _start(backend, "t-new")
    assert _spawned_at(tdir) is not None
    # The wrapper ran (and, with no spec file here, said so in its log).
    log = spec.parent / "wrapper.log"
    deadline = time.monotonic() + 20
    while "cannot read the learner spec" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.05)


def test_a_start_that_did_not_finish_is_not_observed_as_started(tmp_path: Path) -> None:
    """A worker killed between recording the training and spawning its learners: the
    monitor must see no started training (so that it sends the launch again), not
    learners PENDING for ever."""
    backend, _, spec = _state(tmp_path, "t-half")
    assert backend.observe("t-half") is None
    (spec.parent / "status.json").write_text(json.dumps({"phase": "COMPLETED", "exit_code": 0}))
    _start(backend, "t-half")  # the launch sent again
    observed = backend.observe("t-half")
    assert observed is not None
    assert [(o.phase, o.exit_code) for o in observed.learners] == [("COMPLETED", 0)]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_cleaning_up_a_start_that_failed_after_making_its_network_ends_the_network(
    tmp_path: Path,
) -> None:
    """A start that failed once the learner network was made, before the training's
    state.json was written (it is written once everything is prepared): its cleanup
    ends the network too, at once."""
    available, why = namespaces_available()
    if not available:
        pytest.skip(f"no learner namespaces here: {why}")
    backend = LocalBackend(tmp_path / "work", use_sandbox=False)
    net = LearnerNetwork.create("t-failed", ["learner-f-1"], tmp_path / "work" / "t-failed" / "net")
    assert not (tmp_path / "work" / "t-failed" / "state.json").exists()
    backend.cleanup("t-failed")
    assert not any(_running(pid) for pid in [net.holder_pid, *net.pids.values()])
    assert not (tmp_path / "work" / "t-failed").exists()
