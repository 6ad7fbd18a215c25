"""The Celery app and its tasks: thin, named, idempotent; each loads by id and calls
worker.execution.

`create_celery_app(settings)` makes an app with the tasks registered on it; importing this
module reads no settings. Run a worker with `celery -A worker.celery_app worker --pool=solo`
(the module's `celery`, made from the environment's settings when Celery looks it up) or
`python -m worker`.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from service import dispatch
from service.db.session import DATABASE_UNAVAILABLE
from service.platform import Platform
from service.settings import Settings
from worker import execution
from worker.backends import make_backend
from worker.backends.base import Backend

log = logging.getLogger("dlaas.worker")
# Tries of a task after the first while the database is unavailable (about 8 minutes).
TASK_RETRIES = 10


def create_celery_app(settings: Settings | None = None) -> Celery:
    """A Celery app for `settings` (default: from the environment) with the DLaaS tasks,
    which run on a platform and backend built once, from those settings."""
    resolved = settings if settings is not None else Settings()
    app = dispatch.make_celery(resolved)

    @cache
    def runtime() -> tuple[Platform, Backend]:
        backend = make_backend(resolved)
        if (why := backend.unsandboxed_reason()) is not None:
            allowed = "every tenant's" if resolved.allow_unsandboxed else "the local tenant's only"
            log.warning("learners run without a sandbox here (%s): %s", why, allowed)
        return Platform.from_settings(resolved), backend

    def warm_up(sender: Any = None, **_: Any) -> None:
        # Build the platform and probe the backend (namespaces) before the first launch.
        if getattr(sender, "app", None) is app:
            runtime()

    worker_ready.connect(warm_up, weak=False)

    # shared=False: the tasks close over this app's runtime, so no other app may get them.
    # A task that meets the database down (restarting) is tried again later, with backoff:
    # the monitor sends no second FINALIZE for a training it has already ended.
    retried = {
        "autoretry_for": DATABASE_UNAVAILABLE,
        "retry_backoff": 2,
        "retry_backoff_max": 60,
        "retry_jitter": True,
        "max_retries": TASK_RETRIES,
    }

    @app.task(name=dispatch.LAUNCH, shared=False, **retried)
    def launch_training(training_id: str) -> None:
        platform, backend = runtime()
        execution.launch(platform, backend, training_id)

    @app.task(name=dispatch.STOP, shared=False)
    def stop_training(training_id: str) -> None:
        _platform, backend = runtime()
        execution.stop(backend, training_id)

    @app.task(name=dispatch.FINALIZE, shared=False, **retried)
    def finalize_training(training_id: str) -> None:
        platform, backend = runtime()
        execution.finalize(platform, backend, training_id)

    return app


def __getattr__(name: str) -> Any:
    # `celery -A worker.celery_app` looks up the module's `celery` (this Celery cannot call
    # an app factory named with -A): made on lookup, so that importing reads no settings.
    if name == "celery":
        return create_celery_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
