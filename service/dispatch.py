"""Sending work to the Celery workers, by task name, after the transaction commits.

The API and the monitor only need the broker, not the worker's code: tasks are sent by
name. The embedded default needs no server: a directory under DLAAS_HOME is the broker,
polled every 20 ms (`polling_interval` below).
"""

from __future__ import annotations

import json
import os
import uuid
from time import monotonic
from typing import Any

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES, filesystem

from service.private import private_dir
from service.settings import Settings

LAUNCH = "dlaas.launch_training"
STOP = "dlaas.stop_training"
FINALIZE = "dlaas.finalize_training"
QUEUE = "dlaas"


class _AtomicChannel(filesystem.Channel):
    """kombu's filesystem channel writes a message file in place while a consumer may
    already move and read it: the consumer then reads an empty file and dies. Write it
    under a name consumers ignore and rename it into place once complete."""

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        with open(partial, "wb") as f:
            f.write(json.dumps(payload).encode())
        os.rename(partial, final)


class AtomicFilesystemTransport(filesystem.Transport):
    Channel = _AtomicChannel


TRANSPORT_ALIASES["dlaas-filesystem"] = "service.dispatch:AtomicFilesystemTransport"
EMBEDDED_BROKER = "dlaas-filesystem://"


def make_celery(settings: Settings) -> Celery:
    app = Celery("dlaas")
    url = settings.resolved_broker_url
    conf: dict[str, object] = {
        "broker_url": url,
        "task_default_queue": QUEUE,
        # Acknowledge after the task ran: a worker killed mid-task gets it redelivered
        # (on brokers that redeliver), and every task is idempotent.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }
    if url.startswith(("filesystem://", EMBEDDED_BROKER)):
        folder = private_dir(settings.home_dir / "broker")
        conf["broker_transport_options"] = {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(folder / "control"),
            "polling_interval": 0.02,
            "store_processed": False,
        }
    app.conf.update(conf)
    return app


class Dispatcher:
    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def send(self, task: str, training_id: str) -> None:
        self.celery.send_task(task, args=[training_id], queue=QUEUE)
