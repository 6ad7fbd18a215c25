"""Faults of the servers the platform depends on, with trainings running: the database
restarts, Redis (broker and live log) restarts, the object store is unreachable when the
learners store their results. Each server is the test's own (a private PostgreSQL cluster,
a private redis-server, a moto server), stopped and started again by the test."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import zip_of
from tests.integration.platform_harness import (
    EXAMPLES,
    TERMINAL,
    LivePlatform,
    live_platform,
    training_processes,
    zip_dir,
)
from tests.integration.private_servers import (
    PrivatePostgres,
    PrivateRedis,
    private_postgres,
    private_redis,
)
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, free_port, moto_server

pytestmark = pytest.mark.integration

ENV = EXAMPLES / "env"
HISTORY = ["QUEUED", "PENDING", "DOWNLOADING", "RUNNING", "STORING", "COMPLETED"]


def manifest(command: str, nodes: int = 1) -> dict[str, Any]:
    framework: dict[str, Any] = {"name": "tensorflow", "version": "2.21", "command": command}
    if nodes > 1:
        framework["parameter_servers"] = 0
    return {
        "name": "faults",
        "framework": framework,
        "compute_configuration": {"name": "P100", "nodes": nodes},
    }


def wait_until(what: str, check: Any, timeout: float = 30) -> Any:
    """The first true value of `check()`, polled until `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return value


def assert_unavailable(response: httpx.Response, names: str) -> None:
    """A 503 problem+json whose detail names what is unavailable."""
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 503
    assert problem["type"] == "urn:dlaas:problem:service-unavailable"
    assert names in problem["detail"], problem
    assert int(response.headers["Retry-After"]) > 0


# -- PostgreSQL ----------------------------------------------------------------------------


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    with private_postgres() as pg:
        yield pg


def test_database_restart_answers_503_and_loses_nothing(
    tmp_path: Path, postgres: PrivatePostgres
) -> None:
    with live_platform(tmp_path / "home", postgres.url, monitor_process=True) as live:
        assert live.monitor is not None and live.worker is not None
        earlier = live.submit(manifest("echo early"), ENV)
        earlier = live.wait_for(earlier["id"], TERMINAL, timeout=60)
        assert earlier["status"] == "COMPLETED", earlier
        t = live.submit(manifest("sleep 5; echo finished", nodes=2), ENV)
        live.wait_for(t["id"], {"RUNNING"}, timeout=60)

        postgres.stop()
        assert training_processes(t["id"])  # the learners run on while the database is down
        requests = [
            ("GET", f"/v1/trainings/{t['id']}"),
            ("GET", "/v1/trainings"),
            ("POST", f"/v1/trainings/{t['id']}/stop"),
            ("GET", "/v1/usage"),
        ]
        for method, path in requests:
            assert_unavailable(live.client.request(method, path, headers=live.headers), "database")
        ready = live.client.get("/readyz")
        assert ready.status_code == 503 and "database" in ready.json()["detail"]
        # The learners end while nothing can record it.
        wait_until("the learners to end", lambda: not training_processes(t["id"]))
        # Now the key cache's last look at revocations is old: the key itself is checked
        # against the database (in the request gate), and that too answers 503, as does a
        # submission.
        for method, path in requests:
            assert_unavailable(live.client.request(method, path, headers=live.headers), "database")
        r = live.client.post(
            "/v1/trainings",
            files={
                "manifest": ("manifest.yaml", yaml.safe_dump(manifest("echo lost"))),
                "model_definition": ("code.zip", zip_dir(ENV)),
            },
            headers=live.headers,
        )
        assert_unavailable(r, "database")

        postgres.start()
        done = live.wait_for(t["id"], TERMINAL, timeout=60)
        assert done["status"] == "COMPLETED", done
        assert [h["status"] for h in done["status_history"]] == HISTORY
        learners = [(lr["status"], lr["exit_code"]) for lr in done["learners"]]
        assert learners == [("COMPLETED", 0)] * 2
        assert live.logs(t["id"]).count("finished") == 2
        after = live.get(earlier["id"])
        assert after["status_history"] == earlier["status_history"]
        assert after["learners"] == earlier["learners"]
        # The submission refused during the outage left nothing behind.
        listed = live.client.get("/v1/trainings", headers=live.headers).json()["items"]
        assert {item["id"] for item in listed} == {earlier["id"], t["id"]}
        # The same monitor and worker processes went on, and still work: a new training
        # is admitted, launched and finalized.
        again = live.submit(manifest("echo again"), ENV)
        assert live.wait_for(again["id"], TERMINAL, timeout=60)["status"] == "COMPLETED"
        assert live.monitor.poll() is None and live.worker.poll() is None


# -- Redis ---------------------------------------------------------------------------------


@pytest.fixture
def redis_server() -> Iterator[PrivateRedis]:
    with private_redis() as server:
        yield server


def local_log(live: LivePlatform, training_id: str) -> Path:
    """The learner's own training-log.txt, as its wrapper writes it."""
    found = list((live.settings.work_dir / training_id).rglob("training-log.txt"))
    assert len(found) == 1, found
    return found[0]


def ticks(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"tick=(\d+) ", text)]


GAP = re.compile(
    r"\[dlaas\] (\d+) log line\(s\) could not be sent to the live log while it was "
    r"unavailable; training-log.txt in the results has them all"
)


def test_redis_restart_keeps_trainings_going_and_marks_the_log_gap(
    tmp_path: Path, redis_server: PrivateRedis
) -> None:
    with live_platform(
        tmp_path / "home",
        f"sqlite:///{tmp_path / 'dlaas.db'}",
        DLAAS_BROKER_URL=redis_server.url,
        DLAAS_LOG_STORE_URL=redis_server.url,
    ) as live:
        count = 160  # 8 s of lines: some before, during and after the outage
        t = live.submit(manifest(f"python3 slow.py --seconds {count * 0.05} --interval 0.05"), ENV)
        wait_until("live log lines", lambda: ticks(live.logs(t["id"])))

        redis_server.stop()
        own_log = local_log(live, t["id"])
        at_stop = len(ticks(own_log.read_text()))
        assert at_stop < count
        # The command goes on printing while the live log is down.
        wait_until("lines during the outage", lambda: len(ticks(own_log.read_text())) > at_stop + 5)
        assert_unavailable(
            live.client.get(f"/v1/trainings/{t['id']}/logs", headers=live.headers), "log store"
        )
        redis_server.start()

        done = live.wait_for(t["id"], TERMINAL, timeout=60)
        assert done["status"] == "COMPLETED", done
        logs = live.logs(t["id"])
        lines = logs.splitlines()
        markers = [i for i, line in enumerate(lines) if GAP.search(line)]
        assert len(markers) == 1, logs
        reported = int(GAP.search(lines[markers[0]]).group(1))  # type: ignore[union-attr]
        live_ticks = ticks(logs)
        missing = sorted(set(range(count)) - set(live_ticks))
        # Lines were lost from the live log, the marker says so (never fewer than were
        # lost) and stands where they are missing; the lines after the restart are there.
        assert missing and len(missing) <= reported, (missing, reported)
        before = ticks("\n".join(lines[: markers[0]]))
        after = ticks("\n".join(lines[markers[0] :]))
        assert before and after and max(before) < missing[0] and min(after) > missing[-1]
        assert lines[-1].endswith(f"done ticks={count}")
        # The learner's own log, stored with the results, has every line.
        stored = live.results(t["id"])["learner-1/training-log.txt"].decode()
        assert ticks(stored) == list(range(count))
        assert not GAP.search(stored)
        # The broker came back for new work too: launch, observe, finalize.
        again = live.submit(manifest("echo again"), ENV)
        assert live.wait_for(again["id"], TERMINAL, timeout=60)["status"] == "COMPLETED"
        assert "again" in live.logs(again["id"])
        assert live.worker is not None and live.worker.poll() is None


# -- the object store at STORING -----------------------------------------------------------

# The command writes its results, then takes a while: the store goes down meanwhile.
TRAIN_PY = """
import os, pathlib, sys, time
res = pathlib.Path(os.environ["RESULT_DIR"])
(res / "model.bin").write_bytes(b"model bytes")
print("results written", flush=True)
time.sleep(float(sys.argv[1]))
"""


class RestartableS3:
    """moto's server on a port of its own, stopped and started again on the same port (a
    restarted moto has lost its buckets and objects)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._running: ExitStack | None = None

    def start(self) -> S3Server:
        with ExitStack() as stack:
            server = stack.enter_context(moto_server(self.port))
            self._running = stack.pop_all()
        return server

    def stop(self) -> None:
        if self._running is not None:
            self._running.close()
            self._running = None


@pytest.fixture
def s3() -> Iterator[RestartableS3]:
    server = RestartableS3()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def s3_platform(tmp_path: Path, s3: RestartableS3, attempts: int) -> Any:
    """The platform with its store on `s3`; learners try each upload `attempts` times."""
    return live_platform(
        tmp_path / "home",
        f"sqlite:///{tmp_path / 'dlaas.db'}",
        DLAAS_S3_ENDPOINT=s3.url,
        DLAAS_S3_ACCESS_KEY=ACCESS_KEY,
        DLAAS_S3_SECRET_KEY=SECRET_KEY,
        DLAAS_S3_BUCKET="platform",
        DLAAS_STORE_RETRY_ATTEMPTS=str(attempts),
        DLAAS_STORE_RETRY_SECONDS="40",
    )


CODE = zip_of({"train.py": TRAIN_PY})


def test_an_object_store_down_at_storing_fails_the_training_naming_it(
    tmp_path: Path, s3: RestartableS3
) -> None:
    with s3_platform(tmp_path, s3, attempts=3) as live:
        t = live.submit(manifest("python3 train.py 3"), CODE)
        live.wait_for(t["id"], {"RUNNING"}, timeout=60)
        s3.stop()  # before the command ends: the learner stores into an unreachable store
        done = live.wait_for(t["id"], TERMINAL, timeout=60)
    assert done["status"] == "FAILED", done
    message = done["status_message"]
    assert "learner 1 could not store its files" in message, message
    assert f"the S3 store at {s3.url} (bucket 'platform')" in message, message
    assert "gave up after 3 attempts" in message, message
    assert [h["status"] for h in done["status_history"]][-2:] == ["STORING", "FAILED"]
    assert done["learners"][0]["exit_code"] == 0  # the command itself succeeded


def test_an_object_store_back_during_the_backoff_completes_the_training(
    tmp_path: Path, s3: RestartableS3
) -> None:
    with s3_platform(tmp_path, s3, attempts=8) as live:
        t = live.submit(manifest("python3 train.py 3"), CODE)
        live.wait_for(t["id"], {"RUNNING"}, timeout=60)
        s3.stop()
        live.wait_for(t["id"], {"STORING"}, timeout=60)  # its first upload fails
        s3.start().make_bucket("platform")  # back, empty, while the learner backs off
        done = live.wait_for(t["id"], TERMINAL, timeout=60)
        assert done["status"] == "COMPLETED", done
        assert [h["status"] for h in done["status_history"]] == HISTORY
        results = live.results(t["id"])
    assert results["model.bin"] == b"model bytes"
    assert b"results written" in results["learner-1/training-log.txt"]
