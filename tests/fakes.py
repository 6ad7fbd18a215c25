"""Test doubles shared by several test modules."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from service.storage.base import ObjectStore
from tests.conftest import manifest_yaml
from worker.backends.base import Observation, StartRequest


class RecordingBackend:
    """A backend that starts nothing and records what it was asked to start: for the tests
    of what `execution.launch` hands a backend."""

    def __init__(self) -> None:
        self.requests: list[StartRequest] = []

    def unsandboxed_reason(self) -> str | None:
        return None

    def start(self, request: StartRequest) -> None:
        self.requests.append(request)

    def cleanup(self, training_id: str) -> None:
        pass


class Learners:
    """A backend whose observation of every training a test sets, pass by pass: for the
    tests of what the monitor decides."""

    def __init__(self) -> None:
        self.now: Observation | None = None

    def start(self, request: StartRequest) -> None:
        raise AssertionError("the monitor never starts learners itself")

    def observe(self, training_id: str) -> Observation | None:
        return self.now

    def stop(self, training_id: str) -> None:
        pass

    def cleanup(self, training_id: str) -> None:
        pass

    def save_checkpoints(self, training_id: str, store: ObjectStore, prefix: str) -> int | None:
        return None

    def unsandboxed_reason(self) -> str | None:
        return None

    def changed(self) -> set[str] | None:
        return None

    def held(self) -> list[str]:
        return []

    def slots(self) -> int:
        return 8

    def changes(self, wake: Callable[[], None]) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


class Broker:
    """The tasks the monitor sent, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send(self, task: str, training_id: str) -> None:
        self.sent.append((task, training_id))


def two_learners(**fields: Any) -> str:
    """The manifest of a 2-learner TensorFlow training (`fields` added)."""
    return manifest_yaml(
        compute_configuration={"name": "P100", "nodes": 2},
        framework={
            "name": "tensorflow",
            "version": "2.21",
            "command": "python3 train.py",
            "parameter_servers": 0,
        },
        **fields,
    )
