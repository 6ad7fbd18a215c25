"""A training whose runtime is not installed is refused at submission, naming the field and
the command that installs it; one whose runtime is installed is accepted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from fastapi.testclient import TestClient

from service import runtimes
from service.db.models import Training
from service.domain.states import TrainingState
from service.platform import Platform
from service.trainings import record_transition
from tests.conftest import create_tenant, submit
from tests.fakes import RecordingBackend
from tests.manifest_cases import base
from worker import execution
from worker.backends.base import Backend


def horovod(version: str = "2.21") -> str:
    return json.dumps(
        base(
            framework={"name": "tensorflow-horovod", "version": version},
            compute_configuration={"name": "P100", "nodes": 2},
        )
    )


def test_a_training_whose_runtime_is_not_installed_is_refused(
    client: TestClient, platform: Platform
) -> None:
    assert platform.installed_runtimes() == {"platform"}  # an empty runtimes directory
    headers = create_tenant(client, "no-horovod")
    r = submit(client, headers, horovod("1.5"))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    (error,) = r.json()["errors"]
    assert error["field"] == "/framework/version"
    assert "'horovod-tf2.14', which is not installed" in error["message"]
    assert "`dlaas runtimes install horovod-tf2.14`" in error["message"]
    # Nothing was kept of the refused submission.
    assert client.get("/v1/trainings", headers=headers).json()["items"] == []


def test_trainings_in_the_platform_runtime_need_no_install(
    client: TestClient, platform: Platform
) -> None:
    headers = create_tenant(client, "plain-tf")
    r = submit(
        client, headers, json.dumps(base(framework={"name": "tensorflow", "version": "1.5"}))
    )
    assert r.status_code == 201, r.text


def mark_installed(platform: Platform) -> Path:
    """What `dlaas runtimes install horovod-tf2.14` leaves when it has finished: the
    environment and, written last, its runtime.json (this one names the platform's
    Python). Returns the marker."""
    digest = runtimes.requirements_hash((runtimes.DEFINITIONS / "horovod-tf2.14.txt").read_text())
    target = runtimes.runtime_dir(platform.settings.runtimes_path, "horovod-tf2.14", digest)
    target.mkdir(parents=True)
    info = runtimes.platform_runtime()
    marker = target / runtimes.MARKER
    marker.write_text(json.dumps({**info.to_dict(), "requirements_hash": digest}))
    return marker


def test_once_its_runtime_is_installed_the_training_is_accepted(
    client: TestClient, platform: Platform
) -> None:
    mark_installed(platform)
    r = submit(client, create_tenant(client, "with-horovod"), horovod())
    assert r.status_code == 201, r.text


def test_a_runtime_is_startable_as_the_installed_and_defined_ones_say(
    platform: Platform,
) -> None:
    """`runtime_startable` looks at one runtime (what a submission asks) and agrees with
    the listing of every one."""
    names = [*runtimes.known(platform.runtime_definitions), "no-such-runtime"]

    def agrees(startable: set[str]) -> None:
        assert {n for n in names if platform.runtime_startable(n)} == startable

    agrees({"platform"})
    mark_installed(platform)
    agrees({"platform", "horovod-tf2.14"})
    assert platform.installed_runtimes() == {"platform", "horovod-tf2.14"}
    platform.settings.runtime_auto_install = True
    agrees(set(runtimes.known(platform.runtime_definitions)))
    platform.settings.runtime_auto_install = False
    platform.settings.backend = "kubernetes"  # every defined runtime is in its image
    agrees(set(runtimes.known(platform.runtime_definitions)))


def _pending(client: TestClient, platform: Platform, name: str) -> str:
    training_id: str = submit(client, create_tenant(client, name), horovod()).json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        record_transition(training, TrainingState.PENDING)
        session.commit()
    return training_id


def test_the_learners_are_started_in_their_runtime(client: TestClient, platform: Platform) -> None:
    marker = mark_installed(platform)
    training_id = _pending(client, platform, "launched")
    backend = RecordingBackend()
    execution.launch(platform, cast(Backend, backend), training_id)
    [request] = backend.requests
    assert request.runtime is not None
    assert request.runtime.name == "horovod-tf2.14"
    assert request.runtime.prefix == str(marker.parent)


def test_a_runtime_gone_before_the_launch_fails_the_training(
    client: TestClient, platform: Platform
) -> None:
    marker = mark_installed(platform)
    training_id = _pending(client, platform, "uninstalled")
    marker.unlink()  # removed between submission and launch
    backend = RecordingBackend()
    execution.launch(platform, cast(Backend, backend), training_id)
    assert backend.requests == []
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        assert training.status == TrainingState.FAILED
        assert "`dlaas runtimes install horovod-tf2.14`" in (training.status_message or "")


def test_a_training_in_the_platforms_own_runtime_looks_at_no_file(
    client: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most trainings run in the platform's own runtime: their submission scans no
    definitions and reads no installed runtime (each a system call that gives the GIL up
    on a busy API)."""

    def no_files(*_args: object) -> None:
        raise AssertionError("the submission looked at the runtimes on disk")

    monkeypatch.setattr(runtimes, "definitions", no_files)
    monkeypatch.setattr(runtimes, "installed", no_files)
    assert platform.runtime_startable(runtimes.PLATFORM)
    r = submit(client, create_tenant(client, "own-runtime"))
    assert r.status_code == 201, r.text
