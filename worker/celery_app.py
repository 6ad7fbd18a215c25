"""The Celery app and its tasks: thin, named, idempotent; each loads by id and calls
worker.execution.

Run a worker with `celery -A worker.celery_app worker --pool=solo` (or `python -m worker`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from celery.signals import worker_ready

from service import dispatch
from service.platform import Platform
from service.settings import Settings
from worker import execution
from worker.backends import make_backend
from worker.backends.base import Backend

celery = dispatch.make_celery(Settings())


@cache
def _runtime() -> tuple[Platform, Backend]:
    settings = Settings()
    return Platform.from_settings(settings), make_backend(settings)


@worker_ready.connect
def _warm_up(**_: Any) -> None:
    # Build the platform and probe the backend (namespaces) before the first launch.
    _runtime()


@celery.task(name=dispatch.LAUNCH)
def launch_training(training_id: str) -> None:
    platform, backend = _runtime()
    execution.launch(platform, backend, training_id)


@celery.task(name=dispatch.STOP)
def stop_training(training_id: str) -> None:
    _platform, backend = _runtime()
    execution.stop(backend, training_id)


@celery.task(name=dispatch.FINALIZE)
def finalize_training(training_id: str) -> None:
    platform, backend = _runtime()
    execution.finalize(platform, backend, training_id)
