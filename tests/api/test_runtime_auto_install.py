"""DLAAS_RUNTIME_AUTO_INSTALL: a training whose runtime is not installed is accepted and
waits in PENDING while the worker installs the runtime in the background (a real build,
of a small stand-in definition), with the progress in its status_message, and is launched
again when it is installed; a launch never waits for a build (its own or another's), and
a build that fails fails the training saying how to see why."""

from __future__ import annotations

import fcntl
import json
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from service import runtimes
from service.db.models import Training
from service.dispatch import LAUNCH
from service.domain.states import TrainingState
from service.platform import Platform
from service.settings import Settings
from service.trainings import record_transition
from tests.api.test_runtime_check import horovod
from tests.conftest import create_tenant, submit
from tests.fakes import RecordingBackend
from worker import execution, installs
from worker.backends.base import Backend

pytestmark = pytest.mark.integration  # builds a virtual environment

RUNTIME = "horovod-tf2.14"


@pytest.fixture
def definitions(tmp_path: Path) -> Path:
    """A stand-in for the Horovod runtime's definition: no pins, so that its build is just
    the environment (seconds), through the same install as the real one."""
    directory = tmp_path / "definitions"
    directory.mkdir()
    (directory / f"{RUNTIME}.txt").write_text("# a stand-in: the environment alone\n")
    return directory


@pytest.fixture
def settings(settings: Settings, definitions: Path) -> Settings:
    return settings.model_copy(
        update={"runtime_definitions_dir": definitions, "runtime_auto_install": True}
    )


class Sent:
    """A dispatcher that records the tasks sent (the LAUNCH an install sends again)."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, str]] = []

    def send(self, task: str, training_id: str) -> None:
        self.tasks.append((task, training_id))


@pytest.fixture
def sent(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> Sent:
    recorder = Sent()
    monkeypatch.setattr(platform, "dispatcher", recorder)
    return recorder


def _installed(name: str = RUNTIME) -> None:
    """Wait for this process's install of `name` to end."""
    assert installs.INSTALLS.wait(name, timeout=300), f"the install of {name} did not end"


def _status(platform: Platform, training_id: str) -> tuple[str, str]:
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        return training.status, training.status_message or ""


def _pending(client: TestClient, platform: Platform, name: str) -> str:
    r = submit(client, create_tenant(client, name), horovod())
    assert r.status_code == 201, r.text  # accepted although the runtime is not installed
    training_id: str = r.json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        record_transition(training, TrainingState.PENDING, "starting 2 learner(s)")
        session.commit()
    return training_id


def test_the_first_launch_installs_the_runtime_with_its_progress_shown(
    client: TestClient, platform: Platform, sent: Sent
) -> None:
    assert RUNTIME not in platform.installed_runtimes()
    training_id = _pending(client, platform, "first-use")
    seen: list[str] = []
    original = installs._InstallProgress.write

    def recording(self: installs._InstallProgress, message: str, **kw: str | None) -> None:
        original(self, message, **kw)
        seen.append(_status(platform, training_id)[1])

    backend = RecordingBackend()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(installs._InstallProgress, "write", recording)
        execution.launch(platform, cast(Backend, backend), training_id)
        assert backend.requests == []  # the launch did not wait for the build
        _installed()
    # The training showed the install while it waited in PENDING...
    assert seen, "no progress was shown"
    assert all(m.startswith(f"installing the runtime '{RUNTIME}' on its first use (") for m in seen)
    status, message = _status(platform, training_id)
    assert status == TrainingState.PENDING
    assert "installed in" in message
    # ... is launched again once the runtime is installed ...
    assert sent.tasks == [(LAUNCH, training_id)]
    execution.launch(platform, cast(Backend, backend), training_id)
    # ... and its learners start in the runtime just built.
    [request] = backend.requests
    assert request.runtime is not None and request.runtime.name == RUNTIME
    marker = Path(request.runtime.prefix) / runtimes.MARKER
    assert json.loads(marker.read_text())["name"] == RUNTIME
    assert RUNTIME in platform.installed_runtimes()


def test_a_launch_does_not_wait_for_another_processs_install(
    client: TestClient, platform: Platform, definitions: Path, sent: Sent
) -> None:
    training_id = _pending(client, platform, "second")
    digest = runtimes.definition_hash(definitions / f"{RUNTIME}.txt")
    lock = platform.settings.runtimes_path / f".{RUNTIME}-{digest}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    backend = RecordingBackend()
    waiting = f"waiting for the runtime '{RUNTIME}', being installed on its first use"
    with open(lock, "a") as held:  # another process is building the runtime
        fcntl.flock(held, fcntl.LOCK_EX)
        execution.launch(platform, cast(Backend, backend), training_id)
        deadline = time.monotonic() + 30
        while _status(platform, training_id)[1] != waiting:
            assert time.monotonic() < deadline, _status(platform, training_id)
            time.sleep(0.05)
        assert not installs.INSTALLS.wait(RUNTIME, timeout=0.5)  # waits for its turn
    assert backend.requests == []
    # That install over (here: it built nothing), this process's builds the runtime, and
    # the launch, sent again, starts the learners.
    _installed()
    assert RUNTIME in platform.installed_runtimes()
    assert sent.tasks == [(LAUNCH, training_id)]
    execution.launch(platform, cast(Backend, backend), training_id)
    assert [r.spec.training_id for r in backend.requests] == [training_id]


def test_launches_of_one_runtime_share_its_install(
    client: TestClient, platform: Platform, sent: Sent
) -> None:
    first = _pending(client, platform, "one")
    second = _pending(client, platform, "two")
    backend = RecordingBackend()
    release = threading.Event()
    original = platform.install_runtime

    def held_install(*args: Any, **kwargs: Any) -> runtimes.RuntimeInfo:
        assert release.wait(60)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(platform, "install_runtime", held_install)
        execution.launch(platform, cast(Backend, backend), first)
        execution.launch(platform, cast(Backend, backend), second)
        execution.launch(platform, cast(Backend, backend), first)  # sent again: no 2nd build
        assert installs.INSTALLS.running() == [RUNTIME]
        assert _status(platform, second) == (
            TrainingState.PENDING,
            f"waiting for the runtime '{RUNTIME}', being installed on its first use",
        )
        release.set()
        _installed()
    assert backend.requests == []
    assert sent.tasks == [(LAUNCH, first), (LAUNCH, second)]


def test_a_runtime_that_cannot_be_built_fails_the_training(
    client: TestClient, platform: Platform, definitions: Path
) -> None:
    broken = definitions / "packages" / "broken"
    broken.mkdir(parents=True)
    (broken / "pyproject.toml").write_text("[project\n")  # not TOML: pip refuses it
    (definitions / f"{RUNTIME}.txt").write_text("#! local packages/broken\n")
    training_id = _pending(client, platform, "broken")
    backend = RecordingBackend()
    execution.launch(platform, cast(Backend, backend), training_id)
    _installed()
    assert backend.requests == []
    status, message = _status(platform, training_id)
    assert status == TrainingState.FAILED
    assert f"the runtime '{RUNTIME}' could not be installed" in message
    assert f"`dlaas runtimes install {RUNTIME}`" in message
    assert RUNTIME not in platform.installed_runtimes()  # nothing half-built is taken


def test_without_auto_install_the_submission_is_refused(
    client: TestClient, platform: Platform
) -> None:
    platform.settings.runtime_auto_install = False
    r = submit(client, create_tenant(client, "refused"), horovod())
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "/framework/version"
