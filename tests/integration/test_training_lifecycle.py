"""Trainings run for real through the REST API: learner processes in their own namespaces,
a Celery worker subprocess, the monitor. No TensorFlow needed here (see test_frameworks)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dlaas import cli
from dlaas.models import Training
from service.sandbox import limits
from tests import run_redis
from tests.conftest import zip_of
from tests.integration.platform_harness import (
    EXAMPLES,
    LivePlatform,
    live_platform,
    training_processes,
)

pytestmark = pytest.mark.integration

ENV = EXAMPLES / "env"
CONTRACT = [
    "LEARNER_ID",
    "NUM_LEARNERS",
    "LEARNER_NAME_PREFIX",
    "TRAINING_ID",
    "MODEL_DIR",
    "DATA_DIR",
    "RESULT_DIR",
    "LOG_DIR",
    "CHECKPOINT_DIR",
    "GPU_COUNT",
]


def manifest(command: str, nodes: int = 1, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "lifecycle",
        "framework": {"name": "tensorflow", "version": "2.21", "command": command},
        "compute_configuration": {"name": "P100", "nodes": nodes},
    }
    framework_extra = extra.pop("framework", {})
    doc["framework"].update(framework_extra)
    doc.update(extra)
    return doc


def cluster_settings(database_url: str) -> dict[str, str]:
    """On PostgreSQL the platform runs as in a cluster: Redis is the broker and the log
    (this run's own Redis: flushed here, and a Celery queue no other run's worker reads)."""
    if not database_url.startswith("postgresql"):
        return {}
    url = run_redis.url(14)
    redis.Redis.from_url(url).flushdb()
    return {"DLAAS_BROKER_URL": url, "DLAAS_LOG_STORE_URL": url}


@pytest.fixture
def live(tmp_path: Path, database_url: str) -> Iterator[LivePlatform]:
    """The embedded setup (SQLite, a broker directory, log files) and the cluster one
    (PostgreSQL, Redis)."""
    with live_platform(tmp_path / "home", database_url, **cluster_settings(database_url)) as p:
        yield p


def wait_no_processes(training_id: str, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := training_processes(training_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_every_learner_sees_the_environment_contract(live: LivePlatform) -> None:
    t = live.submit(
        manifest("python3 print_env.py", nodes=3, framework={"parameter_servers": 0}), ENV
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"})
    assert done["status"] == "COMPLETED", done
    logs = live.logs(t["id"])
    for i in (1, 2, 3):
        mine = {
            line.split("] ", 1)[1].split("=", 1)[0]: line.split("] ", 1)[1].split("=", 1)[1]
            for line in logs.splitlines()
            if f"[learner {i}] " in line and "=" in line
        }
        assert set(CONTRACT) <= set(mine), (i, mine)
        assert mine["LEARNER_ID"] == str(i) and mine["NUM_LEARNERS"] == "3"
        assert mine["TRAINING_ID"] == t["id"]
        prefix = mine["LEARNER_NAME_PREFIX"]
        assert mine["hostname"] == f"{prefix}-{i}"
        assert '"worker"' in mine["TF_CONFIG"] and mine["PS_HOSTS_COUNT"] == "0"
        assert mine["MODEL_DIR"].endswith(f"learner-{i}/model")
    history = [h["status"] for h in done["status_history"]]
    assert history[0] == "QUEUED" and "RUNNING" in history and history[-1] == "COMPLETED"
    assert [lr["exit_code"] for lr in done["learners"]] == [0, 0, 0]
    assert "learner-1/training-log.txt" in live.results(t["id"])
    assert wait_no_processes(t["id"]) == []


def test_exit_code_fails_the_training_with_the_code(live: LivePlatform) -> None:
    t = live.submit(manifest("python3 fail.py 3"), ENV)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"})
    assert done["status"] == "FAILED"
    assert "learner 1 exited with code 3" in done["status_message"]
    assert done["learners"][0]["exit_code"] == 3
    # Logs are kept even for a failed training.
    assert live.results(t["id"])["learner-1/training-log.txt"] != b""


def test_one_failed_learner_stops_the_others(live: LivePlatform) -> None:
    command = 'if [ "$LEARNER_ID" = 2 ]; then sleep 1; exit 3; fi; exec sleep 120'
    t = live.submit(manifest(command, nodes=3, framework={"parameter_servers": 0}), ENV)
    started = time.monotonic()
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=60)
    assert done["status"] == "FAILED"
    assert "learner 2 exited with code 3" in done["status_message"]
    assert time.monotonic() - started < 30
    assert wait_no_processes(t["id"]) == []
    # The survivors the platform stopped are recorded so, never left RUNNING.
    assert all(lr["status"] in ENDED for lr in done["learners"]), done["learners"]
    learners = wait_learners_recorded(live, t["id"])
    assert [lr["status"] for lr in learners] == ["HALTED", "FAILED", "HALTED"], learners
    assert all(lr["exit_code"] is not None for lr in learners), learners


ENDED = {"COMPLETED", "FAILED", "HALTED", "LOST", "STOPPED"}


def wait_learners_recorded(
    live: LivePlatform, training_id: str, timeout: float = 30
) -> list[dict[str, Any]]:
    """The learners once every one has an exit code (the stopped ones get theirs when the
    worker has stopped them), or as they are at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        learners: list[dict[str, Any]] = live.get(training_id)["learners"]
        if all(lr["exit_code"] is not None for lr in learners) or time.monotonic() > deadline:
            return learners
        time.sleep(0.2)


def test_a_parameter_server_that_exits_0_first_is_not_a_failure(live: LivePlatform) -> None:
    # Learner 1 is the parameter server: it prints its environment and exits 0 before the
    # workers do, as a simple script does on every learner.
    command = 'if [ "$LEARNER_ID" != 1 ]; then sleep 2; fi; python3 print_env.py'
    t = live.submit(manifest(command, nodes=3, framework={"parameter_servers": 1}), ENV)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=90)
    assert done["status"] == "COMPLETED", done
    assert [(lr["status"], lr["exit_code"]) for lr in done["learners"]] == [("COMPLETED", 0)] * 3
    assert "PS_HOSTS_COUNT=1" in live.logs(t["id"])


def test_a_parameter_server_that_exits_non_zero_fails_the_training(live: LivePlatform) -> None:
    command = 'if [ "$LEARNER_ID" = 1 ]; then exit 1; fi; exec sleep 120'
    t = live.submit(manifest(command, nodes=3, framework={"parameter_servers": 1}), ENV)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=60)
    assert done["status"] == "FAILED", done
    assert "learner 1 exited with code 1" in done["status_message"]
    assert all(lr["status"] in ENDED for lr in done["learners"]), done["learners"]
    assert wait_no_processes(t["id"]) == []


def test_a_parameter_server_stopped_at_the_end_is_recorded_stopped(
    live: LivePlatform, capsys: pytest.CaptureFixture[str]
) -> None:
    # The parameter server never exits on its own: the platform stops it when the workers
    # have completed, and the record says so (STOPPED: the workers completed, not HALTED),
    # with its exit code or signal. `dlaas show` says the same, and the history says the
    # states alone: what the sandbox could not enforce is the training's limits_note.
    command = 'if [ "$LEARNER_ID" = 1 ]; then exec sleep 120; fi; sleep 1'
    t = live.submit(manifest(command, nodes=3, framework={"parameter_servers": 1}), ENV)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=90)
    assert done["status"] == "COMPLETED", done
    assert all(lr["status"] in ENDED for lr in done["learners"]), done["learners"]
    assert wait_no_processes(t["id"]) == []
    learners = wait_learners_recorded(live, t["id"])
    ps = learners[0]
    assert (ps["status"], ps["status_message"]) == ("STOPPED", "the workers completed"), ps
    assert ps["exit_code"] is not None, learners
    assert [(lr["status"], lr["exit_code"]) for lr in learners[1:]] == [("COMPLETED", 0)] * 2

    body = live.get(t["id"])
    assert body["status_message"] is None, body
    messages = [e["message"] or "" for e in body["status_history"]]
    assert not any("limit" in m or "enforced" in m for m in messages), messages
    if limits.machine_cgroup() is None:  # said once, where it belongs
        assert "is enforced per process" in (body["limits_note"] or ""), body
    capsys.readouterr()
    cli._show_training(Training.from_json(body))
    shown = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in shown.splitlines()]
    assert any(line.startswith("status COMPLETED") for line in lines), shown
    assert any(line.startswith("1 STOPPED: the workers completed") for line in lines), shown
    history = shown[shown.index("History") :]
    assert "COMPLETED" in history
    assert "limit" not in history and "enforced" not in history, history


def test_stop_halts_and_leaves_no_process(live: LivePlatform) -> None:
    # The command ignores SIGTERM, as TensorFlow does: the grace period ends in SIGKILL.
    t = live.submit(manifest("trap '' TERM; echo started; sleep 120 & wait", nodes=2), ENV)
    live.wait_for(t["id"], {"RUNNING"}, timeout=60)
    r = live.client.post(f"/v1/trainings/{t['id']}/stop", headers=live.headers)
    assert r.status_code == 202
    done = live.wait_for(t["id"], {"HALTED", "FAILED", "COMPLETED"}, timeout=30)
    assert done["status"] == "HALTED", done
    assert wait_no_processes(t["id"]) == []


def test_max_runtime_fails_with_timeout(live: LivePlatform) -> None:
    t = live.submit(manifest("exec sleep 120", max_runtime=2), ENV)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=60)
    assert done["status"] == "FAILED"
    assert "timeout" in done["status_message"]
    assert wait_no_processes(t["id"]) == []


def test_worker_killed_mid_training_is_recovered(live: LivePlatform) -> None:
    t = live.submit(
        manifest("sleep 3; echo finished", nodes=2, framework={"parameter_servers": 0}), ENV
    )
    live.wait_for(t["id"], {"RUNNING"}, timeout=60)
    live.kill_worker()
    time.sleep(4)  # the learners finish while no worker runs
    live.start_worker()
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=60)
    assert done["status"] == "COMPLETED", done
    assert live.logs(t["id"]).count("finished") == 2  # each learner ran exactly once
    assert wait_no_processes(t["id"]) == []


def test_logs_follow_and_metrics(live: LivePlatform) -> None:
    t = live.submit(
        manifest(
            "python3 slow.py --seconds 3",
            evaluation_metrics=[{"name": "loss", "regex": r"loss=([0-9.eE+-]+)"}],
        ),
        ENV,
    )
    lines: list[str] = []
    with live.client.stream(
        "GET", f"/v1/trainings/{t['id']}/logs", params={"follow": "true"}, headers=live.headers
    ) as r:
        assert r.status_code == 200
        lines.extend(r.iter_lines())
    assert live.get(t["id"])["status"] == "COMPLETED"
    ticks = [line for line in lines if "tick=" in line]
    assert len(ticks) >= 10
    assert [int(line.split("tick=")[1].split()[0]) for line in ticks] == list(range(len(ticks)))
    metrics = live.client.get(f"/v1/trainings/{t['id']}/metrics", headers=live.headers).json()
    values = [p["value"] for p in metrics["loss"]]
    logged = [float(line.split("loss=")[1].split()[0]) for line in ticks]
    assert values == logged
    assert {p["learner"] for p in metrics["loss"]} == {1}
    only_2 = live.logs(t["id"], learner=2)
    assert only_2 == ""


FAST_PRINTER = """
import sys
text = "x" * 90
for i in range(int(sys.argv[1])):
    print(f"{i:08d} {text}")
"""


def test_a_follower_sees_every_line_of_a_learner_printing_as_fast_as_it_can(
    live: LivePlatform,
) -> None:
    """100,000 lines, one write each (learners run with PYTHONUNBUFFERED), followed from
    the start: the follower gets them all, in order, and so does a paged read afterwards
    (what benchmarks/log_throughput.py relies on), on the file and the Redis log store."""
    lines = 100_000
    t = live.submit(manifest(f"python3 printer.py {lines}"), zip_of({"printer.py": FAST_PRINTER}))
    expected = [f"{i:08d} {'x' * 90}" for i in range(lines)]
    with live.client.stream(
        "GET", f"/v1/trainings/{t['id']}/logs", params={"follow": "true"}, headers=live.headers
    ) as r:
        assert r.status_code == 200
        followed = [line.split(" ", 3)[3] for line in r.iter_lines() if line]
    assert live.get(t["id"])["status"] == "COMPLETED"
    assert followed == expected
    paged: list[str] = []
    cursor: str | None = None
    while True:
        r = live.client.get(
            f"/v1/trainings/{t['id']}/logs",
            params={"cursor": cursor} if cursor else {},
            headers=live.headers,
        )
        paged += [line.split(" ", 3)[3] for line in r.text.splitlines()]
        cursor = r.headers.get("X-Next-Cursor")
        if not r.text or not cursor:
            break
    assert paged == expected


def test_monitor_killed_mid_training_is_recovered(tmp_path: Path, database_url: str) -> None:
    extra = cluster_settings(database_url)
    with live_platform(tmp_path / "home", database_url, monitor_process=True, **extra) as live:
        t = live.submit(
            manifest("sleep 3; echo finished", nodes=2, framework={"parameter_servers": 0}), ENV
        )
        live.wait_for(t["id"], {"RUNNING"}, timeout=60)
        live.kill_monitor()
        time.sleep(4)  # the learners finish while nothing watches them
        assert live.get(t["id"])["status"] == "RUNNING"
        live.start_monitor()
        done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=60)
        assert done["status"] == "COMPLETED", done
        assert live.logs(t["id"]).count("finished") == 2
        assert wait_no_processes(t["id"]) == []


def test_without_namespaces_learners_share_the_loopback(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'dlaas.db'}"
    with live_platform(tmp_path / "home", db, DLAAS_LOCAL_NAMESPACES="false") as live:
        t = live.submit(
            manifest("python3 print_env.py", nodes=2, framework={"parameter_servers": 0}), ENV
        )
        done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=60)
        logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", done
    # Said once, on the training (its limits_note), not as its status.
    assert "learner namespaces are unavailable" in done["limits_note"]
    assert done["status_message"] is None
    configs = [
        json.loads(line.split("TF_CONFIG=", 1)[1])
        for line in logs.splitlines()
        if "TF_CONFIG=" in line
    ]
    workers = configs[0]["cluster"]["worker"]
    assert len(configs) == 2 and all(c["cluster"]["worker"] == workers for c in configs)
    hosts = {w.split(":")[0] for w in workers}
    ports = {w.split(":")[1] for w in workers}
    assert hosts == {"127.0.0.1"} and len(ports) == 2


def test_learners_wake_the_monitor(tmp_path: Path, database_url: str) -> None:
    """With a monitor that would poll only every 60 s, a training still goes from submit
    to COMPLETED in seconds: the API wakes the monitor (same process) and each learner's
    status change is sent to it (the local backend's notification socket)."""
    settings = {**cluster_settings(database_url), "DLAAS_MONITOR_INTERVAL": "60"}
    with live_platform(tmp_path / "home", database_url, **settings) as live:
        started = time.monotonic()
        t = live.submit(manifest("sleep 0.5", nodes=2, framework={"parameter_servers": 0}), ENV)
        done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=30)
        elapsed = time.monotonic() - started
        socket_path = live.settings.work_dir / "monitor.sock"
        assert socket_path.is_socket()
    assert done["status"] == "COMPLETED", done
    assert [h["status"] for h in done["status_history"]] == [
        "QUEUED",
        "PENDING",
        "DOWNLOADING",
        "RUNNING",
        "STORING",
        "COMPLETED",
    ]
    assert elapsed < 30  # 60 s polling would not have seen the first learner start
    assert not socket_path.exists()  # the monitor cleans up after itself


def test_notifications_without_a_listener_are_harmless(tmp_path: Path) -> None:
    """A learner whose monitor is gone (or whose socket path is too long to bind) goes on:
    the monitor's polling sees its status."""
    from worker.backends.local import LocalBackend
    from worker.learner.status import notify

    notify(str(tmp_path / "nobody-listens.sock"), "t1")
    backend = LocalBackend(tmp_path / ("x" * 120), use_namespaces=False)
    woken: list[bool] = []
    with backend.changes(lambda: woken.append(True)):  # cannot bind: polling only
        notify(str(backend.notify_path), "t1")
    assert woken == []
    backend = LocalBackend(tmp_path / "work", use_namespaces=False)
    with backend.changes(lambda: woken.append(True)):
        notify(str(backend.notify_path), "t1")
        deadline = time.monotonic() + 5
        while not woken and time.monotonic() < deadline:
            time.sleep(0.01)
    assert woken == [True]
