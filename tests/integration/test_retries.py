"""Retries from checkpoints, for real: learners lost or exiting with a listed code, a new
attempt that restores CHECKPOINT_DIR, and `dlaas up`'s shutdown resumed on the next start."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from composition.shutdown import interrupt_active_trainings
from service.db import repository
from service.domain.states import TrainingState
from service.platform import Platform
from service.trainings import record_transition
from tests.conftest import submit
from tests.integration.platform_harness import LivePlatform, live_platform, training_processes
from tests.integration.test_training_lifecycle import cluster_settings, manifest

pytestmark = pytest.mark.integration

# Each learner counts steps, checkpointing the step it reached; it resumes from the
# checkpoint it finds. On its first attempt (no checkpoint) `hang` waits at step 5 to be
# killed, `exit3` exits 3 there; `always3` exits 3 two steps into every attempt.
# Before its step 5 a first attempt waits until every learner has checkpointed a step
# (CHECKPOINT_DIR is shared): a learner that started late on a loaded machine and was
# stopped before its first checkpoint would start its next attempt from nothing, take it
# for a first one and exit 3 again (the run then FAILED instead of COMPLETED).
# A learner stopped for the retry (SIGTERM, then its grace period) ends at the end of its
# step, as a program that checkpoints does: a step's checkpoint and the line that logs it
# are one. Killed between them, it would resume from a step its log never showed.
TRAIN = """
import os, pathlib, signal, sys, time
stopping = committing = False
def on_term(signum, frame):
    global stopping
    stopping = True
    if not committing:
        sys.exit(128 + signum)
signal.signal(signal.SIGTERM, on_term)
ckpt_dir = pathlib.Path(os.environ["CHECKPOINT_DIR"])
ckpt = ckpt_dir / ("step-" + os.environ["LEARNER_ID"])
everyone = [ckpt_dir / f"step-{i}" for i in range(1, int(os.environ["NUM_LEARNERS"]) + 1)]
start = int(ckpt.read_text()) if ckpt.exists() else 0
if start:
    print(f"resumed from checkpoint step {start}", flush=True)
mode, steps = sys.argv[1], int(sys.argv[2])
for step in range(start + 1, steps + 1):
    if step == 5 and not start and mode in ("exit3", "hang"):
        while not all(p.exists() for p in everyone):
            time.sleep(0.05)
    time.sleep(0.05)
    committing = True
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(str(step))
    tmp.replace(ckpt)
    print(f"step {step} checkpointed", flush=True)
    committing = False
    if stopping:
        sys.exit(128 + signal.SIGTERM)
    if (mode == "always3" and step == start + 2) or (mode == "exit3" and step == 5 and not start):
        sys.exit(3)
    if step == 5 and start == 0 and mode == "hang":
        time.sleep(600)
print("done", flush=True)
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    d = tmp_path / "code"
    d.mkdir()
    (d / "train.py").write_text(TRAIN)
    return d


@pytest.fixture
def live(tmp_path: Path, database_url: str) -> Iterator[LivePlatform]:
    with live_platform(tmp_path / "home", database_url, **cluster_settings(database_url)) as p:
        yield p


def two_learners(mode: str, retry_policy: dict[str, Any] | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"framework": {"parameter_servers": 0}}
    if retry_policy is not None:
        extra["retry_policy"] = retry_policy
    return manifest(f"python3 train.py {mode} 12", nodes=2, **extra)


def wait_for_log(live: LivePlatform, training_id: str, pattern: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, live.logs(training_id)):
        assert time.monotonic() < deadline, live.logs(training_id)
        time.sleep(0.1)


def kill_learner(live: LivePlatform, training_id: str, learner_id: int) -> None:
    """What a lost node does to a learner: its wrapper and its command gone at once."""
    status_file = live.settings.home_dir / "work" / training_id / f"learner-{learner_id}"
    status = json.loads((status_file / "status.json").read_text())
    for key in ("child_pid", "pid"):
        os.killpg(status[key], signal.SIGKILL)


def archived_log(live: LivePlatform, training_id: str, learner_id: int) -> str:
    """Learner i's training-log.txt once the worker has wrapped the training up (it
    rewrites a retried training's from the whole log, every attempt's output in it)."""
    key = f"learner-{learner_id}/training-log.txt"
    deadline = time.monotonic() + 30
    while True:
        text = live.results(training_id).get(key, b"").decode()
        if "[dlaas] attempt" in text or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def reached_in_first_attempt(log: str, learner_id: int) -> int:
    """The last step learner i checkpointed before its first attempt ended."""
    first = log.split(f"[learner {learner_id}] [dlaas] attempt 1", 1)[0]
    steps = re.findall(rf"\[learner {learner_id}\] step (\d+) checkpointed", first)
    return int(steps[-1])


def resumed_steps(log: str, learner_id: int) -> list[int]:
    return [
        int(m)
        for m in re.findall(rf"\[learner {learner_id}\] resumed from checkpoint step (\d+)", log)
    ]


def test_a_lost_learner_is_retried_and_resumes_from_its_checkpoint(
    live: LivePlatform, code: Path
) -> None:
    t = live.submit(two_learners("hang", {"max_retries": 1, "retry_on_lost": True}), code)
    wait_for_log(live, t["id"], r"\[learner 2\] step 5 checkpointed")
    kill_learner(live, t["id"], 2)

    done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=120)
    assert done["status"] == "COMPLETED", done
    assert done["attempt"] == 2
    log = live.logs(t["id"])
    # Each learner continued from the step it had checkpointed, not from the start.
    assert resumed_steps(log, 2) == [5]
    assert resumed_steps(log, 1) == [reached_in_first_attempt(log, 1)]
    assert "[learner 2] step 6 checkpointed" in log
    assert log.count("[learner 2] step 1 checkpointed") == 1
    # Every attempt's output is kept, with the attempt's start marked in it.
    assert "[learner 2] [dlaas] attempt 1 of 2 failed" in log
    # The first attempt is in the history: its learners and how they ended.
    (first,) = done["past_attempts"]
    assert first["attempt"] == 1
    assert "learner 2" in first["message"] and "attempt 2" in first["message"]
    by_id = {lr["learner_id"]: lr for lr in first["learners"]}
    assert by_id[2]["status"] == "LOST"
    # The survivor was stopped for the retry; what it reported as it stopped is kept.
    assert by_id[1]["status"] in ("HALTED", "FAILED")
    assert by_id[1]["exit_code"] is not None and by_id[1]["exit_code"] < 0, by_id[1]
    assert [lr["status"] for lr in done["learners"]] == ["COMPLETED", "COMPLETED"]
    history = [(e["status"], e["attempt"]) for e in done["status_history"]]
    assert ("PENDING", 2) in history and ("RUNNING", 1) in history
    assert history[-1] == ("COMPLETED", 2)
    assert sum(1 for s, _ in history if s in ("COMPLETED", "FAILED", "HALTED")) == 1
    # The archived logs hold both attempts too; the checkpoints are kept and counted.
    archived = archived_log(live, t["id"], 2)
    assert "step 1 checkpointed" in archived and "resumed from checkpoint step 5" in archived
    saved = list(live.platform.store.list(f"trainings/{t['id']}/checkpoints/"))
    # The wrap-up records the results' bytes last, after it has archived the logs.
    deadline = time.monotonic() + 30
    while True:
        with live.platform.sessions() as session:
            row = repository.training_by_id(session, t["id"])
            assert row is not None
            if row.results_bytes or time.monotonic() > deadline:
                break
        time.sleep(0.1)
    assert row.results_bytes > 0
    assert row.checkpoint_bytes == sum(info.size for info in saved) > 0
    stored = row.code_bytes + row.results_bytes + row.checkpoint_bytes
    usage = live.client.get("/v1/usage", headers=live.headers).json()
    assert usage["stored_bytes"]["used"] == stored
    assert [info.key for info in saved] == [
        f"trainings/{t['id']}/checkpoints/attempt-2/step-1",
        f"trainings/{t['id']}/checkpoints/attempt-2/step-2",
    ]
    assert not training_processes(t["id"])


def test_a_listed_exit_code_is_retried_and_resumes(live: LivePlatform, code: Path) -> None:
    t = live.submit(two_learners("exit3", {"max_retries": 1, "retry_on_exit_codes": [3]}), code)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=120)
    assert done["status"] == "COMPLETED", done
    assert done["attempt"] == 2
    log = live.logs(t["id"])
    # Learner 1 or 2 exited at step 5; the other was stopped at the end of its step: each
    # resumed from the step it had reached.
    for learner in (1, 2):
        assert resumed_steps(log, learner) == [reached_in_first_attempt(log, learner)]
    assert 5 in [reached_in_first_attempt(log, learner) for learner in (1, 2)]
    (first,) = done["past_attempts"]
    assert "exited with code 3" in first["message"]
    assert any(lr["exit_code"] == 3 for lr in first["learners"])


def test_retries_are_capped_and_the_last_failure_names_the_attempt(
    live: LivePlatform, code: Path
) -> None:
    t = live.submit(two_learners("always3", {"max_retries": 1, "retry_on_exit_codes": [3]}), code)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=120)
    assert done["status"] == "FAILED"
    assert done["attempt"] == 2
    assert done["status_message"].startswith("attempt 2 of 2: learner ")
    assert "exited with code 3" in done["status_message"]
    assert "no retries left" in done["status_message"]
    assert len(done["past_attempts"]) == 1
    terminal = [e for e in done["status_history"] if e["status"] in ("FAILED", "COMPLETED")]
    assert len(terminal) == 1 and terminal[0]["attempt"] == 2


def test_without_a_policy_a_lost_learner_fails_the_training(live: LivePlatform, code: Path) -> None:
    t = live.submit(two_learners("hang", None), code)
    wait_for_log(live, t["id"], r"\[learner 2\] step 5 checkpointed")
    kill_learner(live, t["id"], 2)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=60)
    assert done["status"] == "FAILED"
    assert done["attempt"] == 1 and done["past_attempts"] == []
    assert "learner 2" in done["status_message"]


def test_an_exit_code_not_listed_is_not_retried(live: LivePlatform, code: Path) -> None:
    t = live.submit(two_learners("exit3", {"max_retries": 1, "retry_on_exit_codes": [4]}), code)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=60)
    assert done["status"] == "FAILED"
    assert done["attempt"] == 1
    assert done["status_message"].startswith("attempt 1 of 2: ")
    assert "does not retry it" in done["status_message"]


def test_a_shut_down_platform_resumes_the_training_on_its_next_start(
    tmp_path: Path, code: Path
) -> None:
    with live_platform(
        tmp_path / "home", f"sqlite:///{tmp_path}/db.sqlite", monitor_process=True
    ) as live:
        t = live.submit(two_learners("hang", {"max_retries": 1, "retry_on_lost": True}), code)
        halted = live.submit(two_learners("hang", None), code)
        wait_for_log(live, t["id"], r"\[learner 2\] step 5 checkpointed")
        wait_for_log(live, halted["id"], r"\[learner 2\] step 5 checkpointed")
        # `dlaas up` stopping: no monitor and no worker left, then the trainings interrupted.
        live.kill_monitor()
        live.kill_worker()
        interrupted = interrupt_active_trainings(live.platform)
        assert (interrupted.resuming, interrupted.halted) == ([t["id"]], [halted["id"]])
        waiting = live.get(t["id"])
        assert waiting["status"] == "PENDING" and waiting["attempt"] == 2
        assert "interrupted" in waiting["status_message"]
        assert "resumes as attempt 2" in waiting["status_message"]
        assert not training_processes(t["id"])
        stopped = live.get(halted["id"])
        assert stopped["status"] == "HALTED" and "shut down" in stopped["status_message"]
        # The next start.
        live.start_worker()
        live.start_monitor()
        done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=120)
    assert done["status"] == "COMPLETED", done
    assert done["attempt"] == 2
    assert resumed_steps(live.logs(t["id"]), 2) == [5]


def test_a_start_cut_short_is_released_at_shutdown_and_launched_whole_next_time(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    """A worker killed between recording a training's learners and spawning them all
    leaves a half-started training (PENDING): the shutdown releases what it holds, so the
    next start launches every learner."""
    tid = submit(client, tenant).json()["id"]
    with platform.sessions() as session:
        training = repository.training_by_id(session, tid)
        assert training is not None
        record_transition(training, TrainingState.PENDING, "starting")
        session.commit()
    tdir = platform.settings.work_dir / tid
    (tdir / "learner-1").mkdir(parents=True)
    state = {
        "training_id": tid,
        "attempt": 1,
        "primaries": [1],
        "notes": [],
        "learners": [
            {"learner_id": 1, "spec": str(tdir / "learner-1" / "spec.json"), "spawned_at": None}
        ],
    }
    (tdir / "state.json").write_text(json.dumps(state))
    interrupted = interrupt_active_trainings(platform)
    assert (interrupted.halted, interrupted.resuming) == ([], [])
    assert not tdir.exists()
    assert client.get(f"/v1/trainings/{tid}", headers=tenant).json()["status"] == "PENDING"
