"""Deployed models run outside the scoring service: each deployment's model (a SavedModel
or an ONNX model) in a process of its own (service/scoring/model_server.py), inside the
sandbox.

`ModelProcess` starts one: socket pairs for its connections (nothing to connect to from
elsewhere), the sandbox of service.sandbox (the model directory and the Python runtime
read-only, no network, a private /tmp, nothing of DLAAS_HOME or the platform) and an
environment of a few variables (none of DLAAS_*). Before the model is loaded the process
describes saved_model.pb (or model.onnx) and service.domain.model_ops (or
service.domain.onnx_rules) decides whether it may be loaded at all. The process is
untrusted: what it sends is read as frames of a small header and raw array bytes,
bounded (an answer no larger than its signature allows: process_messages.answer_limits),
and checked against the signatures before anything uses it; nothing of it is unpickled.
A call is made from a thread (`call`, blocking) or from the event loop (`start_call`: the
frame written and the answer read as the socket is ready, service.scoring.loop_calls).

service.scoring.supervised keeps one running and restarts it when it exits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from service import sandbox
from service.domain.model_ops import ATTRS_OF_INTEREST
from service.domain.signature import SignatureInfo
from service.errors import DlaasError, ServiceUnavailable
from service.scoring import model_wire
from service.scoring.loop_calls import Answer, LoopCall
from service.scoring.model_wire import (
    MAX_GRAPH_HEADER,
    Closed,
    FrameReader,
    WireError,
    encode,
    encode_call,
    receive,
    send,
    tensors_of,
)
from service.scoring.process_messages import (
    answer_limits,
    check_outputs,
    refusal,
    signatures_from_json,
)

log = logging.getLogger("dlaas.scoring")

# The model process's program, run by its path and never imported here: model_server.py,
# and the files it loads beside it, the wire format and the ONNX half.
WIRE = Path(model_wire.__file__).resolve()
SERVER = WIRE.with_name("model_server.py")
ONNX_SERVER = WIRE.with_name("onnx_model.py")
# All the model process's environment. TensorFlow needs no more; DLAAS_* never go in.
# One inter-op thread: a served model is called with gaps between calls, and each call
# after a gap had to wake TensorFlow's inter-op pool again, which made a small model's
# call about 1.7x as long as back to back (benchmarks/scoring_hop.py, README "Round
# nine"). Ops still use every core within themselves (the intra-op pool).
ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",  # noqa: S108 - the sandbox's private /tmp
    "TMPDIR": "/tmp",  # noqa: S108
    "LANG": "C.UTF-8",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_NUM_INTEROP_THREADS": "1",
}
_MAX_MESSAGE = 600


class ModelProblem(Exception):
    """Why a model cannot be served, in words for its deployment's status_message."""


class ModelRefused(ModelProblem):
    """The model will not be run at all (an operation it may not use; no sandbox)."""


class ModelInputError(ValueError):
    """The model refused the inputs (TensorFlow's InvalidArgumentError): the caller's fault,
    answered with a 400."""


class ModelDown(ServiceUnavailable):
    """The deployment's model process is gone (and being restarted)."""

    def __init__(self, detail: str, *, retry_after: int | None = None) -> None:
        super().__init__(detail)
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)


class ModelFailed(DlaasError):
    """The model failed on a request for a reason of its own (not the inputs)."""

    status = 502
    title = "Model failed"
    slug = "model-failed"


class _Gone(Exception):
    """The process can take no more calls; str() says why when the exit status does not."""


@dataclass(frozen=True)
class ProcessConfig:
    # Connections to each process: the model calls it runs at once.
    connections: int
    # Seconds a call may take before the process is restarted.
    call_timeout: float
    # Run the model without a sandbox where none can be made.
    allow_unsandboxed: bool = False
    # Directories the sandbox hides (DLAAS_HOME) where a system path would show them.
    hidden: tuple[str, ...] = ()
    # Seconds to describe, load and warm up the model.
    start_timeout: float = 300.0


def _clip(text: str, limit: int = _MAX_MESSAGE) -> str:
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_exit(code: int, *, sandboxed: bool) -> str:
    """`exited (signal 9, SIGKILL)`; bwrap reports its child's death by signal N as 128+N."""
    number = -code if code < 0 else code - 128 if sandboxed and 128 < code < 160 else None
    if number is None:
        return f"exited (exit code {code})"
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"exited (signal {number})"
    return f"exited (signal {number}, {name})"


def command(model_dir: Path, fds: list[int], config: ProcessConfig) -> tuple[list[str], bool]:
    """The model process's command line, and whether it runs in the sandbox."""
    program = [sys.executable, "-I", str(SERVER), "--model", str(model_dir)]
    program += [arg for fd in fds for arg in ("--fd", str(fd))]
    support = sandbox.probe()
    if support.bwrap is not None:
        policy = sandbox.SandboxPolicy(
            writable=(),
            readonly=(
                *sandbox.runtime_paths(),
                str(model_dir),
                str(SERVER),
                str(WIRE),
                str(ONNX_SERVER),
            ),
            network=False,
            hidden=config.hidden,
            cwd="/",
        )
        return [*sandbox.argv(policy, support.bwrap), *program], True
    if config.allow_unsandboxed:
        return program, False
    raise ModelRefused(
        f"no sandbox can be made on this machine to run the model in ({support.why}); "
        "on a one-user machine DLAAS_ALLOW_UNSANDBOXED=true runs models without one"
    )


# ---- one process ----


class ModelProcess:
    """A model process: started, described, checked, loaded; then called."""

    def __init__(self, name: str, model_dir: Path, config: ProcessConfig) -> None:
        self.name = name
        self.model_dir = model_dir
        self.config = config
        self.signatures: dict[str, SignatureInfo] = {}
        self.sandboxed = False
        self.started = time.monotonic()
        self._popen: subprocess.Popen[bytes] | None = None
        self._idle: list[socket.socket] = []
        self._all: list[socket.socket] = []
        self._cond = threading.Condition()
        self._gone: str | None = None
        self._stopped: str | None = None  # why we stopped it, if we did
        self._output: collections.deque[str] = collections.deque(maxlen=20)
        self._reader: threading.Thread | None = None

    # -- starting --

    def start(self) -> None:
        """Start, describe, check and load; ModelProblem (ModelRefused) says why not."""
        pairs = [socket.socketpair() for _ in range(max(1, self.config.connections))]
        ours, theirs = [a for a, _ in pairs], [b for _, b in pairs]
        try:
            argv, self.sandboxed = command(
                self.model_dir, [s.fileno() for s in theirs], self.config
            )
            self._popen = subprocess.Popen(
                argv,
                pass_fds=[s.fileno() for s in theirs],
                env=ENVIRONMENT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd="/",
                start_new_session=True,
            )
        except BaseException:
            for s in ours:
                s.close()
            raise
        finally:
            for s in theirs:
                s.close()
        self.started = time.monotonic()
        self._all = list(ours)
        assert self._popen.stdout is not None
        self._reader = threading.Thread(
            target=self._read_output, args=(self._popen.stdout,), daemon=True
        )
        self._reader.start()
        try:
            self._handshake(ours[0])
        except BaseException:
            self.stop("it did not start")
            raise
        self._idle = list(ours)

    def _read_output(self, stream: IO[bytes]) -> None:
        """Keep the last lines the model wrote (for the reports), stack traces left out;
        nothing more."""
        with contextlib.suppress(OSError, ValueError):
            while line := stream.readline(4096):
                text = _clip(line.decode(errors="replace"), 300)
                if text and not text.startswith(("@ ", "*** ", "Traceback", "File ")):
                    self._output.append(text)

    def _handshake(self, control: socket.socket) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        try:
            send(control, encode({"op": "describe", "attrs": list(ATTRS_OF_INTEREST)}))
            header = self._expect(control, "graph", deadline, MAX_GRAPH_HEADER)
            refused = refusal(header)
            if refused is not None:
                raise ModelRefused(refused)
            send(control, encode({"op": "load"}))
            header = self._expect(control, "ready", deadline, model_wire.MAX_HEADER)
            self.signatures = signatures_from_json(header.get("signatures"))
        except TimeoutError as e:
            raise ModelProblem(
                f"the model process did not load the model in {self.config.start_timeout:g} s"
            ) from e
        except (Closed, OSError) as e:
            raise ModelProblem(f"the model process {self.exit_reason(wait=5)} while loading") from e
        except WireError as e:
            raise ModelProblem(f"the model process answered what no model process does: {e}") from e

    def _expect(
        self, control: socket.socket, op: str, deadline: float, max_header: int
    ) -> dict[str, Any]:
        control.settimeout(max(0.001, deadline - time.monotonic()))
        header, _ = receive(control, max_header=max_header, max_body=0)
        if header.get("op") == "failed":
            error = header.get("error")
            raise ModelProblem(f"the model could not be loaded: {_clip(str(error))}")
        if header.get("op") != op:
            raise WireError(f"{header.get('op')!r} where {op!r} was expected")
        return header

    # -- calling --

    def call(
        self, signature: SignatureInfo, tensors: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The outputs of `signature` on `tensors`; ModelInputError (the caller's inputs),
        ModelFailed (the model's own failure) or _Gone (the process is gone). Blocks this
        thread (`start_call` is the event loop's way)."""
        timeout = self.config.call_timeout
        deadline = time.monotonic() + timeout
        frame = encode_call(signature.name, tensors)
        max_header, max_body = answer_limits(signature, _rows(tensors))
        try:
            conn = self._take(deadline)
        except TimeoutError as e:
            self.stop(f"was stopped: no call ended in {timeout:g} s")
            raise _Gone() from e
        healthy = False
        try:
            conn.settimeout(timeout)
            send(conn, frame)
            header, body = receive(
                conn, deadline=deadline, max_header=max_header, max_body=max_body
            )
            outputs = self._answer(signature, header, body)
            healthy = True
            return outputs
        except (ModelInputError, ModelFailed):
            healthy = True
            raise
        except TimeoutError as e:
            self.stop(f"was stopped: a call took longer than {timeout:g} s")
            raise _Gone() from e
        except (Closed, OSError) as e:
            raise _Gone() from e
        except WireError as e:
            self.stop(self._broke(e))
            raise _Gone() from e
        finally:
            self._give(conn, healthy)

    def _answer(
        self, signature: SignatureInfo, header: dict[str, Any], body: memoryview
    ) -> dict[str, np.ndarray]:
        """The outputs an answer carries, checked against `signature`; the errors it
        reports raised (ModelInputError, ModelFailed); WireError if it is neither."""
        op = header.get("op")
        if op == "error":
            message = _clip(str(header.get("message")))
            if header.get("kind") == "input":
                raise ModelInputError(message)
            raise ModelFailed(f"the model of deployment {self.name} failed: {message}")
        if op != "result":
            raise WireError(f"{op!r} where a result was expected")
        return check_outputs(signature, tensors_of(header, body))

    @staticmethod
    def _broke(error: WireError) -> str:
        return f"was stopped: it answered what no model process does ({_clip(str(error))})"

    def start_call(
        self,
        signature: SignatureInfo,
        tensors: Mapping[str, np.ndarray],
        loop: asyncio.AbstractEventLoop,
        gone: Callable[[asyncio.Future[dict[str, np.ndarray]]], None],
    ) -> asyncio.Future[dict[str, np.ndarray]] | None:
        """`call` driven by the running `loop`, no thread in between: a future of the
        outputs (or of call's ModelInputError, ModelFailed), or None when every connection
        is taken (try again when a call ends). Where call raises _Gone, `gone(future)`
        is called to fail it. Whatever the process must be stopped for is stopped in a
        worker thread, never on the loop."""
        with self._cond:
            if self._gone is not None:
                raise _Gone()
            if not self._idle:
                return None
            conn = self._idle.pop()
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        try:
            frame = encode_call(signature.name, tensors)
            max_header, max_body = answer_limits(signature, _rows(tensors))
        except BaseException:
            self._give(conn, True)
            raise
        timeout = self.config.call_timeout

        def done(outcome: Answer | BaseException) -> None:
            healthy = False
            try:
                if isinstance(outcome, BaseException):
                    raise outcome
                outputs = self._answer(signature, *outcome)
                healthy = True
                if not future.done():
                    future.set_result(outputs)
            except (ModelInputError, ModelFailed) as e:
                healthy = True
                if not future.done():
                    future.set_exception(e)
            except TimeoutError:
                self._stop_soon(loop, f"was stopped: a call took longer than {timeout:g} s")
                gone(future)
            except WireError as e:
                self._stop_soon(loop, self._broke(e))
                gone(future)
            except (Closed, OSError):
                gone(future)
            finally:
                self._give(conn, healthy)

        LoopCall(loop, conn, frame, FrameReader(max_header=max_header, max_body=max_body),
                 timeout, done)  # fmt: skip
        return future

    def _stop_soon(self, loop: asyncio.AbstractEventLoop, why: str) -> None:
        """`stop` in a worker thread (it waits for the process); the reason is kept now."""
        if self._stopped is None:
            self._stopped = why
        loop.run_in_executor(None, self.stop, why)

    def _take(self, deadline: float) -> socket.socket:
        with self._cond:
            while not self._idle and self._gone is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no connection to the model process came free")
                self._cond.wait(remaining)
            if self._gone is not None:
                raise _Gone()
            return self._idle.pop()

    def _give(self, conn: socket.socket, healthy: bool) -> None:
        with self._cond:
            if healthy and self._gone is None:
                self._idle.append(conn)
            else:
                with contextlib.suppress(OSError):
                    conn.close()
            self._cond.notify()

    # -- ending --

    def wait(self) -> int:
        assert self._popen is not None
        code = self._popen.wait()
        self._mark_gone()
        return code

    def exit_reason(self, *, wait: float = 0) -> str:
        """How the process ended (`exited (signal 6, SIGABRT): <its last line>`)."""
        if self._stopped is not None:
            return self._stopped
        code = None
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._popen.wait(wait)
        if code is None:
            return "stopped answering"
        how = describe_exit(code, sandboxed=self.sandboxed)
        if self._reader is not None:
            self._reader.join(1)
        last = self._output[-1] if self._output else ""
        return f"{how}: {last}" if last else how

    def _mark_gone(self) -> None:
        with self._cond:
            if self._gone is None:
                self._gone = "gone"
            for s in self._idle:
                with contextlib.suppress(OSError):
                    s.close()
            self._idle.clear()
            self._cond.notify_all()

    def stop(self, why: str) -> None:
        """Kill the process (and the sandbox around it), saying why."""
        if self._stopped is None:
            self._stopped = why
        popen = self._popen
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
        for s in self._all:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._mark_gone()
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)
            if popen.stdout is not None:
                with contextlib.suppress(OSError):
                    popen.stdout.close()


def _rows(tensors: Mapping[str, np.ndarray]) -> int | None:
    """The instances of a call: the first dimension its inputs share, if they do."""
    firsts = {t.shape[0] if t.ndim else None for t in tensors.values()}
    return firsts.pop() if len(firsts) == 1 else None
