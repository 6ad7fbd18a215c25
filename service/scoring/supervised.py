"""A deployment's model process kept running: `SupervisedModel` starts one
(service.scoring.process.ModelProcess) and, when it exits (a crash, a kill, a call that did
not end in DLAAS_SCORING_CALL_TIMEOUT), fails the calls waiting on it and those that follow
with a 503 saying so while it restarts it, with a backoff, reporting each event. Other
deployments and the scoring service itself go on. Calls come from threads (`call`) or from
the event loop (`start_call`, no thread in between)."""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from service.domain.signature import SignatureInfo
from service.scoring.batching import ModelUnloaded
from service.scoring.process import (
    ModelDown,
    ModelProcess,
    ModelRefused,
    ProcessConfig,
    _Gone,
)

# Restarts wait 1 s, then twice as long each time, up to a minute; a process that ran a
# minute starts the count again.
_FIRST_BACKOFF = 1.0
_MAX_BACKOFF = 60.0
_STABLE = 60.0

Report = Callable[[str, str], None]


class SupervisedModel:
    """A deployment's model process, restarted when it exits; `report(deployment_id,
    message)` is told each time it goes down and comes back."""

    def __init__(self, name: str, model_dir: Path, config: ProcessConfig, report: Report) -> None:
        self.name = name
        self.model_dir = model_dir
        self.config = config
        self.report = report
        self.signatures: dict[str, SignatureInfo] = {}
        self._process: ModelProcess | None = None
        self._down = "is not started"
        self._retry_at = 0.0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the first process; ModelProblem says why it cannot."""
        process = ModelProcess(self.name, self.model_dir, self.config)
        process.start()
        self.signatures = process.signatures
        self._process = process
        self._thread = threading.Thread(target=self._watch, name=f"model-{self.name}", daemon=True)
        self._thread.start()

    def call(
        self, signature: SignatureInfo, tensors: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        process = self._process
        if process is None:
            raise self._unavailable(self._down)
        try:
            return process.call(signature, tensors)
        except _Gone as e:
            raise self._unavailable(process.exit_reason(wait=2)) from e

    def start_call(
        self, signature: SignatureInfo, tensors: Mapping[str, np.ndarray]
    ) -> asyncio.Future[dict[str, np.ndarray]] | None:
        """`call` on the running event loop (ModelProcess.start_call): a future of the
        outputs or of call's errors, or None while every connection is taken."""
        loop = asyncio.get_running_loop()
        process = self._process
        if process is None:
            future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
            future.set_exception(self._unavailable(self._down))
            return future
        gone = functools.partial(self._gone, loop, process)
        try:
            return process.start_call(signature, tensors, loop, gone)
        except _Gone:
            future = loop.create_future()
            gone(future)
            return future

    def _gone(
        self,
        loop: asyncio.AbstractEventLoop,
        process: ModelProcess,
        future: asyncio.Future[dict[str, np.ndarray]],
    ) -> None:
        """Fail `future` with the 503 `call` raises, the exit asked for in a worker thread
        (it may wait for the process to end)."""

        def fail(reason: asyncio.Future[str]) -> None:
            if not future.done():
                future.set_exception(self._unavailable(reason.result()))

        reason = loop.run_in_executor(None, functools.partial(process.exit_reason, wait=2))
        reason.add_done_callback(fail)

    def _unavailable(self, why: str) -> Exception:
        if self._closed.is_set():
            return ModelUnloaded("the model was unloaded")
        retry = max(1, math.ceil(self._retry_at - time.monotonic()))
        return ModelDown(
            f"the model process of deployment {self.name} {why}; it is being restarted",
            retry_after=retry,
        )

    def _watch(self) -> None:
        backoff = _FIRST_BACKOFF
        while not self._closed.is_set():
            process = self._process
            assert process is not None
            process.wait()
            if self._closed.is_set():
                return
            how = process.exit_reason(wait=1)
            if time.monotonic() - process.started >= _STABLE:
                backoff = _FIRST_BACKOFF
            self._down = how
            self._process = None
            self._retry_at = time.monotonic() + backoff
            self.report(self.name, f"the model process {how}; it is being restarted")
            while True:
                if self._closed.wait(backoff):
                    return
                backoff = min(backoff * 2, _MAX_BACKOFF)
                replacement = ModelProcess(self.name, self.model_dir, self.config)
                try:
                    replacement.start()
                except ModelRefused as e:
                    self._down = f"{how}, and cannot be restarted: {e}"
                    self.report(self.name, f"the model process {self._down}")
                    return
                except Exception as e:
                    self._down = f"{how}, and could not be restarted ({e})"
                    self._retry_at = time.monotonic() + backoff
                    self.report(
                        self.name,
                        f"the model process {self._down}; trying again in {backoff:g} s",
                    )
                    continue
                if self._closed.is_set():
                    replacement.stop("was unloaded")
                    return
                self._process = replacement
                when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                self.report(self.name, f"the model process was restarted at {when} after it {how}")
                break

    def close(self) -> None:
        """Stop the process for good (the deployment was deleted, the service stops)."""
        self._closed.set()
        process = self._process
        if process is not None:
            process.stop("was unloaded")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(15)
