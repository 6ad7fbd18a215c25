"""The model process from the scoring service's side, without TensorFlow: the wire format
both ends speak, a model process that misbehaves (fake ones, speaking the protocol badly),
restarts, and the sandbox it is started in."""

from __future__ import annotations

import ast
import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service import sandbox
from service.domain.signature import SignatureInfo, TensorInfo
from service.scoring import model_server, model_wire, process, supervised
from service.scoring.batching import ModelUnloaded
from service.scoring.model_wire import Closed, WireError, encode, receive, send, tensors_of
from service.scoring.process import (
    ENVIRONMENT,
    ModelDown,
    ModelFailed,
    ModelInputError,
    ModelProblem,
    ModelProcess,
    ModelRefused,
    ProcessConfig,
    describe_exit,
)
from service.scoring.supervised import SupervisedModel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def roundtrip(
    pair: tuple[socket.socket, socket.socket], tensors: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    a, b = pair
    sender = threading.Thread(target=send, args=(a, encode({"op": "call"}, tensors)))
    sender.start()
    header, body = receive(b)
    sender.join()
    assert header["op"] == "call"
    return tensors_of(header, body)


def test_arrays_cross_as_they_are(pair: tuple[socket.socket, socket.socket]) -> None:
    tensors = {
        "f": np.arange(12, dtype=np.float32).reshape(3, 4),
        "i": np.array([[-(2**62)], [7]], dtype=np.int64),
        "b": np.array([True, False]),
        "c": np.array([1 + 2j], dtype=np.complex64),
        "scalar": np.float64(2.5) * np.ones(()),
        "empty": np.zeros((0, 3), dtype=np.uint8),
        "s": np.array([[b"a", b""], [b"\xff\x00", "t\u00e9xt".encode()]], dtype=object),
        "big": np.ones((300, 300), dtype=np.float64),  # past the first receive's 64 KiB
    }
    got = roundtrip(pair, tensors)
    assert list(got) == list(tensors)
    for name, array in tensors.items():
        assert got[name].shape == array.shape and got[name].dtype == array.dtype, name
        np.testing.assert_array_equal(got[name], array)


def test_unsendable_dtypes_are_refused() -> None:
    with pytest.raises(WireError, match="datetime64"):
        encode({}, {"t": np.array(["2026-01-01"], dtype="datetime64[D]")})


def frame(header: dict[str, object], body: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return model_wire.PREFIX.pack(len(text), len(body)) + text + body


def spec(name: str, dtype: str, shape: list[int], nbytes: int) -> dict[str, object]:
    return {"name": name, "dtype": dtype, "shape": shape, "nbytes": nbytes}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (frame({"tensors": [spec("x", "float32", [2], 4)]}, b"\0" * 4), "4 bytes for 2"),
        (frame({"tensors": [spec("x", "float32", [1], 8)]}, b"\0" * 4), "not in the body"),
        (frame({"tensors": [spec("x", "float32", [1], 4)]}, b"\0" * 8), "belong to no tensor"),
        (frame({"tensors": [spec("x", "object", [1], 8)]}, b"\0" * 8), "is not one that crosses"),
        (frame({"tensors": [spec("x", "int8", [-1], 0)]}), "integers >= 0"),
        (frame({"tensors": [spec("x", "int8", [1], 1)] * 2}, b"\0\0"), "a name of its own"),
        (
            frame({"tensors": [spec("s", "string", [1], 12)]}, (5).to_bytes(8, "little") + b"abcd"),
            "do not add up",
        ),
        (frame({"tensors": [spec("s", "string", [2], 8)]}, b"\0" * 8), "too few bytes"),
        (frame({}), "without a list of tensors"),
    ],
)
def test_frames_that_do_not_describe_their_body_are_refused(
    pair: tuple[socket.socket, socket.socket], data: bytes, message: str
) -> None:
    a, b = pair
    a.sendall(data)
    header, body = receive(b)
    with pytest.raises(WireError, match=message):
        tensors_of(header, body)


def test_frames_past_the_limits_are_refused_before_they_are_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(model_wire.PREFIX.pack(2**31, 0))
    with pytest.raises(WireError, match="a header of 2147483648 bytes"):
        receive(b)
    a.sendall(model_wire.PREFIX.pack(2, 2**40))
    with pytest.raises(WireError, match="a body of"):
        receive(b)
    a.sendall(model_wire.PREFIX.pack(4, 0) + b"[1]x")
    with pytest.raises(WireError, match="not JSON"):
        receive(b)


def test_a_closed_or_silent_socket(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    with pytest.raises(TimeoutError):
        receive(b, deadline=time.monotonic() + 0.05)
    a.sendall(b"\0\0")
    a.close()
    with pytest.raises(Closed):
        receive(b)


@pytest.mark.parametrize("program", ["model_server.py", "model_wire.py", "onnx_model.py"])
def test_the_model_program_imports_nothing_of_the_platform(program: str) -> None:
    """It runs in the sandbox, where the platform's files are not; TensorFlow (or onnx and
    ONNX Runtime) it imports by name, when the process loads the model."""
    tree = ast.parse(Path(model_server.__file__).with_name(program).read_text())
    imported = {
        ((node.module or "") if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    allowed = set(sys.stdlib_module_names) | {"numpy", "__future__"}
    assert imported <= allowed, imported - allowed


@pytest.mark.parametrize(
    ("code", "sandboxed", "text"),
    [
        (-9, False, "exited (signal 9, SIGKILL)"),
        (134, True, "exited (signal 6, SIGABRT)"),
        (134, False, "exited (exit code 134)"),
        (1, True, "exited (exit code 1)"),
    ],
)
def test_how_an_exit_is_told(code: int, sandboxed: bool, text: str) -> None:
    assert describe_exit(code, sandboxed=sandboxed) == text


# ---- fake model processes ----

FAKE = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from service.scoring.model_wire import encode, receive, send, socket
behaviour = sys.argv[2]
fds = [int(a) for a in sys.argv[4::2]]
control = socket.socket(fileno=fds[0])
receive(control)
graph = {"nodes": [], "functions": {"f": [{"name": "n", "op": "ReadFile"}]}
         if behaviour == "forbidden" else {}}
send(control, encode({"op": "graph", "graph": [graph]}))
header, _ = receive(control)
print("loading", flush=True)
print("environment", *sorted(os.environ), flush=True)
sig = {"inputs": [{"name": "x", "dtype": "float32", "shape": [None, 2]}],
       "outputs": [{"name": "y", "dtype": "float32", "shape": [None, 1]}]}
send(control, encode({"op": "ready", "signatures": {"serving_default": sig}}))
while True:
    header, body = receive(control)
    rows = header["tensors"][0]["shape"][0]
    if behaviour == "wrong_dtype":
        answer = encode({"op": "result"}, {"y": np.zeros((rows, 1), dtype=np.int32)})
    elif behaviour == "huge":
        answer = [b"\\xff\\xff\\xff\\x7f" + bytes(8)]
    elif behaviour == "oversized":
        answer = encode({"op": "result"}, {"y": np.ones((rows * 1000, 1), dtype=np.float32)})
    elif behaviour == "hang":
        time.sleep(60)
    elif behaviour == "crash":
        print("about to crash on purpose", flush=True)
        os.abort()
    elif behaviour == "input":
        answer = encode({"op": "error", "kind": "input", "message": "x is wrong"})
    elif behaviour == "model":
        answer = encode({"op": "error", "kind": "model", "message": "OOM: too big"})
    else:
        answer = encode({"op": "result"}, {"y": np.ones((rows, 1), dtype=np.float32)})
    send(control, answer)
"""

SIGNATURE = SignatureInfo(
    "serving_default",
    {"x": TensorInfo("x", "float32", (None, 2))},
    {"y": TensorInfo("y", "float32", (None, 1))},
)
X = {"x": np.zeros((3, 2), dtype=np.float32)}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Model processes run FAKE with the behaviours of this list, one per start."""
    behaviours: list[str] = []

    def command(model_dir: Path, fds: list[int], config: ProcessConfig) -> tuple[list[str], bool]:
        behaviour = behaviours.pop(0) if len(behaviours) > 1 else behaviours[0]
        args = [arg for fd in fds for arg in ("--fd", str(fd))]
        return [sys.executable, "-c", FAKE, str(ROOT), behaviour, *args], False

    monkeypatch.setattr(process, "command", command)
    monkeypatch.setattr(supervised, "_FIRST_BACKOFF", 0.05)
    yield behaviours


def config(timeout: float = 10.0) -> ProcessConfig:
    return ProcessConfig(connections=1, call_timeout=timeout, start_timeout=30)


def test_a_model_with_a_forbidden_op_is_refused_before_it_is_loaded(
    fake: list[str], tmp_path: Path
) -> None:
    fake.append("forbidden")
    p = ModelProcess("d1", tmp_path, config())
    with pytest.raises(ModelRefused, match="the operation ReadFile \\(in function f\\)"):
        p.start()
    assert "loading" not in p._output  # it was never told to load
    assert p._popen is not None and p._popen.poll() is not None


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [
        ("wrong_dtype", "output 'y' of dtype int32, not float32"),
        ("huge", "a header of 2147483647 bytes"),
        ("hang", "a call took longer than 0.5 s"),
        ("crash", "exited (signal 6, SIGABRT): about to crash on purpose"),
    ],
)
def test_a_misbehaving_process_is_stopped_and_restarted(
    fake: list[str], tmp_path: Path, behaviour: str, why: str
) -> None:
    fake += [behaviour, "good"]
    reports: list[str] = []
    model = SupervisedModel("d1", tmp_path, config(timeout=0.5), lambda d, m: reports.append(m))
    model.start()
    try:
        with pytest.raises(ModelDown) as down:
            model.call(SIGNATURE, X)
        assert down.value.status == 503
        assert why in down.value.detail
        assert down.value.detail.startswith("the model process of deployment d1 ")
        assert down.value.detail.endswith("it is being restarted")
        deadline = time.monotonic() + 30
        while True:
            try:
                outputs = model.call(SIGNATURE, X)
                break
            except ModelDown:
                assert time.monotonic() < deadline, reports
                time.sleep(0.05)
        np.testing.assert_array_equal(outputs["y"], np.ones((3, 1), dtype=np.float32))
        assert why in reports[0] and reports[0].endswith("it is being restarted")
        assert reports[1].startswith("the model process was restarted at")
    finally:
        model.close()
    with pytest.raises(ModelUnloaded):
        model.call(SIGNATURE, X)


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [
        ("wrong_dtype", "output 'y' of dtype int32, not float32"),
        ("huge", "a header of 2147483647 bytes"),
        ("oversized", "a body of 12000 bytes (at most 12)"),
        ("hang", "a call took longer than 0.5 s"),
        ("crash", "exited (signal 6, SIGABRT): about to crash on purpose"),
    ],
)
def test_a_misbehaving_process_called_from_the_event_loop_is_stopped_and_restarted(
    fake: list[str], tmp_path: Path, behaviour: str, why: str
) -> None:
    fake += [behaviour, "good"]
    reports: list[str] = []
    model = SupervisedModel("d1", tmp_path, config(timeout=0.5), lambda d, m: reports.append(m))
    model.start()

    async def call() -> dict[str, np.ndarray]:
        future = model.start_call(SIGNATURE, X)
        assert future is not None
        return await future

    try:
        with pytest.raises(ModelDown) as down:
            asyncio.run(call())
        assert why in down.value.detail and down.value.status == 503
        assert down.value.detail.startswith("the model process of deployment d1 ")
        deadline = time.monotonic() + 30
        while True:
            try:
                outputs = asyncio.run(call())
                break
            except ModelDown:
                assert time.monotonic() < deadline, reports
                time.sleep(0.05)
        np.testing.assert_array_equal(outputs["y"], np.ones((3, 1), dtype=np.float32))
        assert why in reports[0]
    finally:
        model.close()


def test_errors_the_model_reports_on_the_event_loop(fake: list[str], tmp_path: Path) -> None:
    fake.append("input")
    model = SupervisedModel("d1", tmp_path, config(), lambda d, m: None)
    model.start()

    async def calls() -> None:
        for _ in range(2):  # the connection is still good after the first
            future = model.start_call(SIGNATURE, X)
            assert future is not None
            with pytest.raises(ModelInputError, match="x is wrong"):
                await future
        taken = model.start_call(SIGNATURE, X)  # the one connection, in use ...
        assert taken is not None and model.start_call(SIGNATURE, X) is None  # ... by it
        with pytest.raises(ModelInputError):
            await taken

    try:
        asyncio.run(calls())
    finally:
        model.close()


def test_errors_the_model_reports(
    fake: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLAAS_SECRET_KEY", "the platform's")
    fake.append("input")
    model = SupervisedModel("d1", tmp_path, config(), lambda d, m: None)
    model.start()
    try:
        assert model._process is not None
        deadline = time.monotonic() + 10
        while not (seen := [o for o in model._process._output if o.startswith("environment")]):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert seen[0].split()[1:] == sorted(ENVIRONMENT)  # DLAAS_* never go in
        with pytest.raises(ModelInputError, match="x is wrong"):
            model.call(SIGNATURE, X)
        with pytest.raises(ModelInputError):  # the connection is still good
            model.call(SIGNATURE, X)
    finally:
        model.close()
    fake[:] = ["model"]
    model = SupervisedModel("d2", tmp_path, config(), lambda d, m: None)
    model.start()
    try:
        with pytest.raises(ModelFailed, match="the model of deployment d2 failed: OOM") as e:
            model.call(SIGNATURE, X)
        assert e.value.status == 502
    finally:
        model.close()


# ---- the sandbox ----


def test_no_sandbox_means_no_model_unless_allowed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.SandboxSupport(None, "bwrap is gone"))
    with pytest.raises(ModelRefused, match=r"\(bwrap is gone\).*DLAAS_ALLOW_UNSANDBOXED=true"):
        process.command(tmp_path, [3], config())
    allowed = ProcessConfig(connections=1, call_timeout=1, allow_unsandboxed=True)
    argv, sandboxed = process.command(tmp_path, [3], allowed)
    assert not sandboxed and argv[:3] == [sys.executable, "-I", str(process.SERVER)]


def test_a_model_with_no_sandbox_to_run_in_fails_saying_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.SandboxSupport(None, "no bwrap"))
    with pytest.raises(ModelProblem, match="no sandbox can be made on this machine"):
        ModelProcess("d1", tmp_path, config()).start()


CHECK = """
import json, os, socket, sys
home, model, secret = sys.argv[1:4]
try:
    socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
    network = "reached"
except OSError as e:
    network = type(e).__name__
try:
    open(os.path.join(model, "new"), "w")
    writable = True
except OSError:
    writable = False
print(json.dumps({
    "secret": os.path.exists(secret),
    "home_entries": sorted(os.listdir(home)) if os.path.isdir(home) else None,
    "model": sorted(os.listdir(model)),
    "model_writable": writable,
    "source": os.path.exists(os.path.join(sys.argv[4], "pyproject.toml")),
    "env": sorted(os.environ),
    "network": network,
}))
"""


@pytest.mark.skipif(not sandbox.probe().available, reason="no sandbox can be made here")
def test_the_model_process_sees_its_model_and_nothing_of_the_platform(tmp_path: Path) -> None:
    home = tmp_path / "home"
    model = home / "scoring" / "models" / "d1"
    model.mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"graph")
    (home / "secret_key").write_text("platform secret")
    hidden = ProcessConfig(connections=1, call_timeout=1, hidden=(str(home),))
    argv, sandboxed = process.command(model, [3], hidden)
    assert sandboxed
    prefix = argv[: argv.index("--") + 1]
    check = [sys.executable, "-I", "-c", CHECK, str(home), str(model)]
    done = subprocess.run(
        [*prefix, *check, str(home / "secret_key"), str(ROOT)],
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["secret"] is False
    assert seen["home_entries"] == ["scoring"]  # only the path to the model directory
    assert seen["model"] == ["saved_model.pb"] and seen["model_writable"] is False
    assert seen["source"] is False
    assert not [k for k in seen["env"] if k.startswith("DLAAS_")]
    assert seen["network"] != "reached"
