"""The worker's Celery app: made by a factory, its tasks named as the dispatcher sends them
and run on a platform built once from the settings the app was made with."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery.app.utils import find_app

import worker.celery_app
from service import dispatch
from service.settings import Settings
from worker.celery_app import create_celery_app

TASKS = {dispatch.LAUNCH, dispatch.STOP, dispatch.FINALIZE}


def dlaas_tasks(app: Any) -> set[str]:
    return {name for name in app.tasks if name.startswith("dlaas.")}


def test_the_app_has_the_tasks_the_dispatcher_sends(tmp_path: Path) -> None:
    app = create_celery_app(Settings(home=tmp_path / "home"))
    assert dlaas_tasks(app) == TASKS
    assert (tmp_path / "home" / "broker").is_dir()  # the embedded broker of these settings


def test_tasks_run_on_a_runtime_built_once_from_the_apps_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Settings] = []
    stopped: list[tuple[object, str]] = []
    backend = SimpleNamespace(unsandboxed_reason=lambda: None)

    def from_settings(settings: Settings) -> object:
        built.append(settings)
        return object()

    monkeypatch.setattr(worker.celery_app.Platform, "from_settings", from_settings)
    monkeypatch.setattr(worker.celery_app, "make_backend", lambda settings: backend)
    monkeypatch.setattr(
        worker.celery_app.execution, "stop", lambda b, tid: stopped.append((b, tid))
    )
    mine, other = Settings(home=tmp_path / "a"), Settings(home=tmp_path / "b")
    app = create_celery_app(mine)
    create_celery_app(other)  # another app: its tasks and runtime are its own

    app.tasks[dispatch.STOP]("t1")
    app.tasks[dispatch.STOP]("t2")
    assert built == [mine]
    assert stopped == [(backend, "t1"), (backend, "t2")]


def test_celery_dash_a_finds_an_app_made_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLAAS_HOME", str(tmp_path / "env-home"))
    app = find_app("worker.celery_app")  # what `celery -A worker.celery_app` does
    assert dlaas_tasks(app) == TASKS
    assert (tmp_path / "env-home" / "broker").is_dir()
    with pytest.raises(AttributeError):
        worker.celery_app.nothing_here  # noqa: B018


@pytest.mark.parametrize("task", [dispatch.LAUNCH, dispatch.FINALIZE])
def test_a_task_that_meets_the_database_down_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task: str
) -> None:
    from sqlalchemy.exc import OperationalError

    calls: list[str] = []

    def flaky(platform: object, backend: object, training_id: str) -> None:
        calls.append(training_id)
        if len(calls) < 3:
            raise OperationalError("SELECT 1", {}, Exception("the database system is starting up"))

    backend = SimpleNamespace(unsandboxed_reason=lambda: None)
    monkeypatch.setattr(worker.celery_app.Platform, "from_settings", lambda s: object())
    monkeypatch.setattr(worker.celery_app, "make_backend", lambda settings: backend)
    name = "launch" if task == dispatch.LAUNCH else "finalize"
    monkeypatch.setattr(worker.celery_app.execution, name, flaky)
    app = create_celery_app(Settings(home=tmp_path / "home"))
    app.conf.task_always_eager = True  # retries run at once, in this thread
    result = app.tasks[task].apply(("t1",))
    assert result.successful(), result.result
    assert calls == ["t1", "t1", "t1"]


def test_any_other_error_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def broken(platform: object, backend: object, training_id: str) -> None:
        calls.append(training_id)
        raise ValueError("a bug")

    backend = SimpleNamespace(unsandboxed_reason=lambda: None)
    monkeypatch.setattr(worker.celery_app.Platform, "from_settings", lambda s: object())
    monkeypatch.setattr(worker.celery_app, "make_backend", lambda settings: backend)
    monkeypatch.setattr(worker.celery_app.execution, "finalize", broken)
    app = create_celery_app(Settings(home=tmp_path / "home"))
    app.conf.task_always_eager = True
    result = app.tasks[dispatch.FINALIZE].apply(("t1",))
    assert result.failed() and calls == ["t1"]
