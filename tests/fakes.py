"""Test doubles shared by several test modules."""

from __future__ import annotations

from worker.backends.base import StartRequest


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
