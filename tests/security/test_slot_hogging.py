"""Slot hogging: one tenant fills the platform's learner slots with week-long trainings.

A plan's max_concurrent_trainings bounds trainings, not the learner slots they hold, and
max_max_runtime lets each run a week. With the plan's max_active_nodes a tenant's active
trainings hold at most that many slots: its further sleepers wait QUEUED, saying why,
and another tenant's training starts and completes while the sleepers run.

The real platform (tests/integration/platform_harness: the API, the monitor, a Celery
worker subprocess, learners as processes) with 4 learner slots; everything is stopped at
the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import zip_of
from tests.integration.platform_harness import (
    ADMIN,
    TERMINAL,
    LivePlatform,
    live_platform,
    training_processes,
)

pytestmark = pytest.mark.integration

SLOTS = 4
LIMIT = 2  # the plan's max_active_nodes
WEEK = 7 * 24 * 3600
PLAN = {
    "distributed": True,
    "max_nodes": 2,
    "max_concurrent_trainings": 8,
    "max_active_nodes": LIMIT,
    "predictions_per_minute": 100,
    "max_max_runtime": WEEK,
}
CODE = zip_of({"train.py": "print('B was served')\n"})


@pytest.fixture
def live(tmp_path: Path, database_url: str) -> Iterator[LivePlatform]:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        yaml.safe_dump(
            {
                "plans": {
                    "standard": {**PLAN, "max_nodes": 16, "max_active_nodes": 64},
                    "shared": PLAN,
                }
            }
        )
    )
    with live_platform(
        tmp_path / "home",
        database_url,
        DLAAS_LOCAL_SLOTS=str(SLOTS),
        DLAAS_CATALOG_FILE=str(catalog),
    ) as p:
        yield p


def _tenant(live: LivePlatform, name: str) -> dict[str, str]:
    r = live.client.post(
        "/v1/tenants",
        json={"name": name, "plan": "shared"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def _manifest(name: str, command: str, nodes: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "framework": {"name": "tensorflow", "version": "2.21", "command": command},
        "compute_configuration": {"name": "P100", "nodes": nodes},
        **extra,
    }


def _as(live: LivePlatform, headers: dict[str, str]) -> LivePlatform:
    live.headers = headers
    return live


def _wait(what: str, check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_tenant_cannot_hold_every_learner_slot_for_a_week(live: LivePlatform) -> None:
    hog, other = _tenant(live, "hog"), _tenant(live, "other")
    sleepers: list[str] = []
    try:
        # A submits enough week-long sleepers to fill every slot of the platform: more
        # than its plan's learner slots.
        for i in range(SLOTS):
            manifest = _manifest(f"sleeper-{i}", "sleep 604800", max_runtime=WEEK)
            sleepers.append(_as(live, hog).submit(manifest, CODE)["id"])
        running, queued = sleepers[:LIMIT], sleepers[LIMIT:]
        for tid in running:
            assert live.wait_for(tid, {"RUNNING", *TERMINAL})["status"] == "RUNNING"
        waiting = f"waiting: the plan allows {LIMIT} active learners; {LIMIT} in use"
        for tid in queued:
            _wait(f"{tid}'s waiting message", lambda t=tid: live.get(t)["status_message"])
            shown = live.get(tid)
            assert (shown["status"], shown["status_message"]) == ("QUEUED", waiting)
        usage = live.client.get("/v1/usage", headers=hog).json()
        assert usage["active_nodes"] == {"used": LIMIT, "limit": LIMIT}

        # B's training starts and completes while A's sleepers run.
        _as(live, other)
        theirs = live.submit(_manifest("served", "sleep 1; python3 train.py"), CODE)["id"]
        done = live.wait_for(theirs, TERMINAL, timeout=120)
        assert done["status"] == "COMPLETED", done
        assert "RUNNING" in [e["status"] for e in done["status_history"]]
        assert "B was served" in live.logs(theirs)

        _as(live, hog)
        assert [live.get(t)["status"] for t in running] == ["RUNNING"] * LIMIT
        for tid in queued:
            shown = live.get(tid)
            assert (shown["status"], shown["status_message"]) == ("QUEUED", waiting)
        # A training that could never fit the plan is refused at submission.
        r = live.client.post(
            "/v1/trainings",
            files={
                "manifest": (
                    "manifest.yaml",
                    yaml.safe_dump(_manifest("too-big", "sleep 604800", nodes=LIMIT + 1)),
                ),
                "model_definition": ("code.zip", CODE),
            },
            headers=hog,
        )
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "/compute_configuration/nodes"
    finally:
        _as(live, hog)
        for tid in sleepers:
            live.client.post(f"/v1/trainings/{tid}/stop", headers=hog)
        for tid in sleepers:
            assert live.wait_for(tid, TERMINAL, timeout=120)["status"] in TERMINAL
        _wait(
            "the sleepers' processes to end",
            lambda: not any(training_processes(t) for t in sleepers),
            timeout=30,
        )
