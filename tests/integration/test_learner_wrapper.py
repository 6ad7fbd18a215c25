"""The learner wrapper end to end: real `python -m worker.learner SPEC` processes running a
small script from a zip in a LocalObjectStore, logging to a FileLogStore."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service import sandbox
from service.logs.base import LogRecord
from service.logs.config import LogSinkConfig
from service.logs.files import FileLogStore
from service.sandbox.limits import Enforcement
from service.storage.config import StoreConfig
from service.storage.local import LocalObjectStore
from worker.launchers.plan import learner_shell
from worker.learner.host import LocalHost
from worker.learner.spec import LearnerSpec

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TID = "training-1"
ARCHIVE_KEY = f"trainings/{TID}/model_definition.zip"
PREFIX = f"trainings/{TID}/results/"
GRACE = 0.5

SCRIPTS = {
    "limits.py": """
        import os
        print("affinity", sorted(os.sched_getaffinity(0)), flush=True)
        try:
            block = bytearray(768 * 1024 * 1024)
            print("allocated", len(block), flush=True)
        except MemoryError:
            print("memory error", flush=True)
    """,
    "peek.py": """
        import os, sys
        for path in sys.argv[1:]:
            print(path, "visible" if os.path.exists(path) else "invisible", flush=True)
    """,
    "train.py": """
        import json, os, sys
        print("hello from learner", os.environ["LEARNER_ID"], flush=True)
        print("a line on stderr", file=sys.stderr, flush=True)
        res, logs = os.environ["RESULT_DIR"], os.environ["LOG_DIR"]
        os.makedirs(f"{res}/model/variables")
        open(f"{res}/model/saved_model.pb", "w").write("pb")
        open(f"{res}/model/variables/v.data", "w").write("v")
        with open(f"{res}/run.json", "w") as f:
            json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
        os.makedirs(f"{logs}/tb")
        open(f"{logs}/tb/events.out", "w").write("ev")
        os.symlink("/etc/passwd", f"{res}/outside")  # must not be uploaded
        os.symlink("model/saved_model.pb", f"{res}/inside")  # a link, even inside: not uploaded
        os.mkfifo(f"{res}/fifo")  # not a file: skipped (opening it would block)
        for i in range(100):
            print(f"line {i}")
    """,
    "fail.py": """
        import os, subprocess, sys
        print("about to fail", flush=True)
        open(os.path.join(os.environ["LOG_DIR"], "debug.txt"), "w").write("dbg")
        # A straggler that keeps the output pipe open: the wrapper must not wait for it.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("straggler", child.pid, os.getpgid(0), flush=True)
        sys.exit(3)
    """,
    "stop.py": """
        import os, signal, subprocess, sys, time
        if sys.argv[1] == "trap":  # like TensorFlow: SIGTERM does not stop it
            signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM, ignoring", flush=True))
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
        child = subprocess.Popen([sys.executable, "-c", code])
        print("ready", os.getpid(), child.pid, flush=True)
        while True:
            time.sleep(0.05)
    """,
    "grace.py": """
        import os, signal, sys, time
        def on_term(signum, frame):  # a last checkpoint, in the stop's grace period
            print("got SIGTERM", flush=True)
            time.sleep(0.5)
            path = os.path.join(os.environ["CHECKPOINT_DIR"], "last")
            with open(path, "w") as f:
                f.write("saved")
            print("checkpointed in the grace period", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(60)
    """,
    "latency.py": """
        import time
        for i in range(50):
            print(f"{time.time():.6f} tick {i}", flush=True)
            time.sleep(0.01)
    """,
    "flood.py": """
        import os, sys, time
        line = "z" * 1023 + "\\n"
        for _ in range(64 * 1024):  # 64 MiB of output
            sys.stdout.write(line)
        sys.stdout.flush()
        time.sleep(0.3)
        status = open(f"/proc/{os.getppid()}/status").read()
        hwm = [l for l in status.splitlines() if l.startswith("VmHWM:")][0].split()[1]
        open(os.path.join(os.environ["RESULT_DIR"], "wrapper_hwm_kib"), "w").write(hwm)
    """,
    "lines.py": """
        import random, sys, time
        random.seed(7)
        sizes = [0, 1, 50, 4000, 20000]
        lines = ["x" * random.choice(sizes) + f" #{i} é" for i in range(300)]
        data = "".join(line + "\\n" for line in lines).encode()
        data += b"y" * 70000 + b"|end\\n"
        data += b"bad \\xff\\xfe bytes\\n"
        data += b"crlf line\\r\\n"
        data += b"no newline at the end"
        out, pos = sys.stdout.buffer, 0
        while pos < len(data):  # arbitrary write boundaries, often in mid-line
            n = random.randint(1, 30000)
            out.write(data[pos : pos + n])
            out.flush()
            pos += n
            if random.random() < 0.1:
                time.sleep(0.002)
    """,
}


def zip_bytes(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, textwrap.dedent(text))
    return buf.getvalue()


class Learner:
    """One learner's world in tmp_path: store, log store, spec, and the wrapper process."""

    def __init__(self, tmp_path: Path, script: list[str], **overrides: Any) -> None:
        self.tmp = tmp_path
        self.store = LocalObjectStore(tmp_path / "store")
        self.logs = FileLogStore(tmp_path / "logs")
        archive = overrides.pop("archive", zip_bytes(SCRIPTS))
        (tmp_path / "code.zip").write_bytes(archive)
        self.store.put_file(ARCHIVE_KEY, tmp_path / "code.zip")
        base = tmp_path / "learner-1"
        dirs = {d: str(base / d) for d in ("model", "data", "result", "logs", "checkpoint")}
        self.env = {
            "LEARNER_ID": "1",
            "NUM_LEARNERS": "1",
            "TRAINING_ID": TID,
            "MODEL_DIR": dirs["model"],
            "DATA_DIR": dirs["data"],
            "RESULT_DIR": dirs["result"],
            "LOG_DIR": dirs["logs"],
            "CHECKPOINT_DIR": dirs["checkpoint"],
            "LC_ALL": "C.UTF-8",  # keeps Python from coercing the locale into the environment
            "CUSTOM": "a value with spaces",
        }
        fields: dict[str, Any] = {
            "training_id": TID,
            "learner_id": 1,
            "num_learners": 1,
            "hostname": "learner-1",
            "argv": [sys.executable, *script],
            "env": self.env,
            "model_dir": dirs["model"],
            "data_dir": dirs["data"],
            "result_dir": dirs["result"],
            "log_dir": dirs["logs"],
            "checkpoint_dir": dirs["checkpoint"],
            "model_definition_key": ARCHIVE_KEY,
            "store": StoreConfig(kind="local", root=str(tmp_path / "store")),
            "log_sink": LogSinkConfig(kind="file", dir=str(tmp_path / "logs")),
            "results_prefix": PREFIX,
            "stop_grace_seconds": GRACE,
        }
        host_fields = {
            name: overrides.pop(name)
            for name in ("ready_file", "wait_for", "wait_timeout", "run_prefix", "limits")
            if name in overrides
        }
        fields.update(overrides)
        self.spec = LearnerSpec(**fields)
        self.spec_path = tmp_path / "spec.json"
        self.spec.write(self.spec_path)
        self.host = LocalHost(
            private_dir=str(base / "wrapper"),
            status_file=str(base / "wrapper" / "status.json"),
            **host_fields,
        )
        self.host_path = tmp_path / "host.json"
        self.host.write(self.host_path)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "worker.learner", str(self.spec_path), str(self.host_path)]
        self.proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE)
        return self.proc

    def run(self, timeout: float = 20) -> int:
        proc = self.start()
        _, err = proc.communicate(timeout=timeout)
        self.stderr = err.decode(errors="replace")
        return proc.returncode

    @property
    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(Path(self.host.status_file).read_text())
        return data

    def keys(self) -> set[str]:
        return {info.key for info in self.store.list(PREFIX)}

    def object_text(self, key: str) -> str:
        with self.store.open(key) as f:
            return f.read().decode()

    def uploaded_log_lines(self) -> list[str]:
        text = self.object_text(f"{PREFIX}learner-1/training-log.txt")
        return [line.split(" ", 1)[1] for line in text.split("\n")[:-1]]

    def records(self) -> list[LogRecord]:
        return self.logs.read(TID, limit=1_000_000)[0]

    def wait_for_line(self, prefix: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.records():
                if r.line.startswith(prefix):
                    return r.line
            time.sleep(0.02)
        raise AssertionError(f"no log line starting with {prefix!r}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def live_in_group(pgid: int) -> list[int]:
    """Processes (not zombies) whose process group is pgid."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def assert_group_gone(pgid: int, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while live_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live_in_group(pgid) == []


def test_success_runs_the_command_and_uploads_results_and_logs(tmp_path: Path) -> None:
    learner = Learner(tmp_path, ["train.py"])
    assert learner.run() == 0, learner.stderr
    status = learner.status
    assert status["phase"] == "COMPLETED"
    assert status["exit_code"] == 0 and status["message"] is None
    assert status["child_pid"] is None
    assert learner.proc is not None and status["pid"] == learner.proc.pid
    assert learner.keys() == {
        f"{PREFIX}model/saved_model.pb",
        f"{PREFIX}model/variables/v.data",
        f"{PREFIX}run.json",
        f"{PREFIX}learner-1/training-log.txt",
        f"{PREFIX}learner-1/logs/tb/events.out",
    }
    run = json.loads(learner.object_text(f"{PREFIX}run.json"))
    assert run["env"] == learner.env
    assert run["cwd"] == os.path.realpath(learner.spec.model_dir)
    expected = ["hello from learner 1", *(f"line {i}" for i in range(100))]
    uploaded = learner.uploaded_log_lines()
    assert sorted(uploaded) == sorted([*expected, "a line on stderr"])
    assert [line for line in uploaded if line != "a line on stderr"] == expected
    assert [r.line for r in learner.records()] == uploaded
    assert {r.learner for r in learner.records()} == {1}
    for d in ("data_dir", "checkpoint_dir"):
        assert Path(getattr(learner.spec, d)).is_dir()


def test_a_failing_command_fails_the_learner_and_still_uploads_its_logs(tmp_path: Path) -> None:
    learner = Learner(tmp_path, ["fail.py"])
    started = time.monotonic()
    assert learner.run() == 1, learner.stderr
    assert time.monotonic() - started < 10  # the straggler holding the pipe was not awaited
    status = learner.status
    assert status["phase"] == "FAILED"
    assert status["exit_code"] == 3
    assert status["message"] == "learner 1 exited with code 3"
    assert learner.keys() == {
        f"{PREFIX}learner-1/training-log.txt",
        f"{PREFIX}learner-1/logs/debug.txt",
    }
    lines = learner.uploaded_log_lines()
    assert lines[0] == "about to fail"
    pgid = lines[1].split()[2]  # straggler <pid> <pgid>
    assert_group_gone(int(pgid))


@pytest.mark.parametrize("mode", ["trap", "polite"])
def test_sigterm_halts_the_whole_process_group(tmp_path: Path, mode: str) -> None:
    learner = Learner(tmp_path, ["stop.py", mode])
    proc = learner.start()
    try:
        _, pid, child = learner.wait_for_line("ready ").split()
        assert learner.status["phase"] == "RUNNING"
        assert learner.status["child_pid"] == int(pid)  # the command's process group
        assert live_in_group(int(pid)) == sorted([int(pid), int(child)])
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=GRACE + 5) == 143
        elapsed = time.monotonic() - started
    finally:
        learner.kill()
    assert elapsed < GRACE + 1
    assert_group_gone(int(pid))
    status = learner.status
    assert status["phase"] == "HALTED"
    if mode == "trap":
        assert status["exit_code"] == -signal.SIGKILL
        assert status["message"] == (
            f"learner 1 was stopped; its command did not stop within {GRACE} s of SIGTERM"
            " and was killed"
        )
        assert "got SIGTERM, ignoring" in learner.uploaded_log_lines()
    else:
        assert status["exit_code"] == -signal.SIGTERM
        assert status["message"] == "learner 1 was stopped"
        assert elapsed < GRACE  # it stopped on TERM: no need to wait out the grace
    assert learner.keys() == {f"{PREFIX}learner-1/training-log.txt"}


@pytest.mark.skipif(not sandbox.probe().available, reason=sandbox.probe().why)
@pytest.mark.parametrize("through", ["exec", "learner shell"])
def test_a_stopped_command_in_the_sandbox_gets_its_grace_period(
    tmp_path: Path, through: str
) -> None:
    """The stop's SIGTERM reaches the command and not the sandbox around it, nor the
    learner's shell: bubblewrap, killed by it, would take the command's PID namespace
    with it, and a shell would die of it at once and end the sandbox so. The command's
    handler runs to its end."""
    base = tmp_path / "learner-1"
    writable = tuple(str(base / d) for d in ("model", "data", "result", "logs", "checkpoint"))
    for d in writable:
        Path(d).mkdir(parents=True)
    policy = sandbox.SandboxPolicy(writable=writable, readonly=sandbox.runtime_paths())
    argv = {
        "exec": [sys.executable, "grace.py"],
        "learner shell": list(learner_shell(f"{sys.executable} grace.py")),
    }[through]
    prefix = sandbox.argv(policy, sandbox.require())
    # A grace period well past the handler's half second, however loaded the machine.
    grace = 10
    learner = Learner(tmp_path, [], argv=argv, run_prefix=prefix, stop_grace_seconds=grace)
    proc = learner.start()
    try:
        learner.wait_for_line("ready")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=grace + 5) == 143
    finally:
        learner.kill()
    lines = learner.uploaded_log_lines()
    assert lines[-2:] == ["got SIGTERM", "checkpointed in the grace period"], lines
    assert (base / "checkpoint" / "last").read_text() == "saved"
    status = learner.status
    assert status["phase"] == "HALTED"
    assert status["exit_code"] == (0 if through == "exec" else -signal.SIGTERM), status
    assert status["message"] == "learner 1 was stopped"


def test_sigterm_before_the_command_starts_halts_at_once(tmp_path: Path) -> None:
    never = str(tmp_path / "never-ready")
    learner = Learner(
        tmp_path, ["train.py"], wait_for=[never], wait_timeout=60, waits_for_peers=True
    )
    proc = learner.start()
    try:
        wait_until(lambda: Path(learner.spec.model_dir, "train.py").exists())
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 143
    finally:
        learner.kill()
    status = learner.status
    assert status["phase"] == "HALTED"
    assert status["exit_code"] is None
    assert status["message"] == "learner 1 was stopped before its command started"


def test_an_unsafe_archive_fails_with_a_message(tmp_path: Path) -> None:
    archive = zip_bytes({"train.py": "print('hi')", "../evil.py": "print('escaped')"})
    learner = Learner(tmp_path, ["train.py"], archive=archive)
    assert learner.run() == 2
    status = learner.status
    assert status["phase"] == "FAILED"
    assert status["message"].startswith("the code archive could not be unpacked: ")
    assert "escapes the archive root" in status["message"]
    assert not (tmp_path / "learner-1" / "evil.py").exists()
    model_dir = Path(learner.spec.model_dir)
    assert not model_dir.exists() or not any(model_dir.iterdir())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_definition_key": "trainings/x/missing.zip"}, "is not in the object store"),
        ({"store": StoreConfig(kind="s3", bucket="b")}, "names an S3 store without an endpoint"),
        ({"argv": ["/nonexistent/python"]}, "learner 1 could not start its command"),
    ],
)
def test_platform_errors_fail_with_exit_2(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    learner = Learner(tmp_path, ["train.py"], **overrides)
    assert learner.run() == 2
    assert learner.status["phase"] == "FAILED"
    assert message in learner.status["message"]


def test_wait_for_times_out_naming_the_missing_learners(tmp_path: Path) -> None:
    ready = tmp_path / "rendezvous"
    learner = Learner(
        tmp_path,
        ["train.py"],
        ready_file=str(ready / "learner-1"),
        wait_for=[str(ready / "learner-1"), str(ready / "learner-2")],
        wait_timeout=0.3,
        waits_for_peers=True,
    )
    assert learner.run() == 2
    status = learner.status
    assert status["phase"] == "FAILED"
    assert "within 0.3 s" in status["message"]
    assert str(ready / "learner-2") in status["message"]
    assert str(ready / "learner-1") not in status["message"]
    assert (ready / "learner-1").exists()


def test_wait_for_proceeds_once_every_learner_is_ready(tmp_path: Path) -> None:
    other = tmp_path / "rendezvous" / "learner-2"
    learner = Learner(
        tmp_path, ["train.py"], wait_for=[str(other)], wait_timeout=20, waits_for_peers=True
    )
    proc = learner.start()
    wait_until(lambda: Path(learner.spec.model_dir, "train.py").exists())
    time.sleep(0.2)
    assert proc.poll() is None
    assert learner.status["phase"] == "DOWNLOADING"
    other.parent.mkdir()
    other.touch()
    assert proc.wait(timeout=20) == 0
    assert learner.status["phase"] == "COMPLETED"


def test_log_lines_reach_the_store_quickly(tmp_path: Path) -> None:
    learner = Learner(tmp_path, ["latency.py"])
    latencies: list[float] = []
    lines: list[str] = []
    proc = learner.start()

    def follow() -> None:
        cursor: str | None = None
        while True:
            done = proc.poll() is not None
            learner.logs.wait(TID, cursor, 0.2)
            records, cursor = learner.logs.read(TID, cursor)
            now = time.time()
            for r in records:
                printed = float(r.line.split()[0])
                latencies.append(now - printed)
                assert r.ts - printed < 0.5
                lines.append(r.line.split(" ", 1)[1])
            if done and not records:
                return

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        assert proc.wait(timeout=20) == 0
    finally:
        follower.join(timeout=10)
        learner.kill()
    assert lines == [f"tick {i}" for i in range(50)]
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    assert p99 < 0.5, latencies


def test_lines_are_never_split_or_merged(tmp_path: Path) -> None:
    learner = Learner(tmp_path, ["lines.py"])
    assert learner.run() == 0, learner.stderr
    random.seed(7)
    sizes = [0, 1, 50, 4000, 20000]
    expected = ["x" * random.choice(sizes) + f" #{i} é" for i in range(300)]
    expected += ["y" * 65536, "y" * (70000 - 65536) + "|end"]  # longer than 64 KiB: cut
    expected += ["bad \ufffd\ufffd bytes", "crlf line", "no newline at the end"]
    assert [r.line for r in learner.records()] == expected
    assert learner.uploaded_log_lines() == expected


def test_the_wrapper_does_not_hold_the_log_in_memory(tmp_path: Path) -> None:
    learner = Learner(tmp_path, ["flood.py"])
    assert learner.run(timeout=60) == 0, learner.stderr
    hwm_mib = int(learner.object_text(f"{PREFIX}wrapper_hwm_kib")) / 1024
    # ~30 MiB to start, ~50 with the bounded buffers; holding the log would be well over 100.
    assert hwm_mib < 85, hwm_mib
    records = learner.logs.read(TID, limit=1_000_000)[0]
    assert len(records) == 64 * 1024
    assert all(r.line == "z" * 1023 for r in records)


def test_logs_go_to_redis_when_the_sink_is_redis(tmp_path: Path) -> None:
    from service.logs.redis import RedisLogStore

    training_id = f"wrapper-test-{os.getpid()}-{time.monotonic_ns()}"
    redis_store = RedisLogStore("redis://127.0.0.1:6379/15")
    learner = Learner(
        tmp_path,
        ["train.py"],
        training_id=training_id,
        log_sink=LogSinkConfig(kind="redis", url="redis://127.0.0.1:6379/15"),
    )
    try:
        assert learner.run() == 0, learner.stderr
        lines = [r.line for r in redis_store.read(training_id)[0]]
        assert lines == learner.uploaded_log_lines()
        assert "line 99" in lines
    finally:
        redis_store.delete(training_id)
        redis_store.close()


def test_the_hosts_limits_apply_to_the_command(tmp_path: Path) -> None:
    learner = Learner(
        tmp_path,
        ["limits.py"],
        limits=Enforcement(rlimit_as=512 * 1024 * 1024, cpu_affinity=(0,)),
    )
    assert learner.run() == 0, learner.stderr
    assert learner.uploaded_log_lines() == ["affinity [0]", "memory error"]
    unlimited = Learner(tmp_path / "unlimited", ["limits.py"])
    assert unlimited.run() == 0, unlimited.stderr
    assert unlimited.uploaded_log_lines()[1] == f"allocated {768 * 1024 * 1024}"


@pytest.mark.skipif(not sandbox.probe().available, reason=sandbox.probe().why)
def test_the_command_runs_behind_the_hosts_sandbox(tmp_path: Path) -> None:
    """The wrapper reads its spec (credentials) and writes its status; the command, in
    the sandbox the host names, sees neither, nor the object store."""
    base = tmp_path / "learner-1"
    writable = tuple(str(base / d) for d in ("model", "data", "result", "logs", "checkpoint"))
    for d in writable:
        Path(d).mkdir(parents=True)
    policy = sandbox.SandboxPolicy(writable=writable, readonly=sandbox.runtime_paths())
    bwrap = sandbox.require()
    private = [str(tmp_path / "spec.json"), str(base / "wrapper" / "status.json")]
    learner = Learner(
        tmp_path,
        ["peek.py", *private, str(tmp_path / "store"), writable[0]],
        run_prefix=sandbox.argv(policy, bwrap),
    )
    assert learner.run() == 0, learner.stderr
    assert learner.uploaded_log_lines() == [
        *(f"{path} invisible" for path in private),
        f"{tmp_path / 'store'} invisible",
        f"{writable[0]} visible",
    ]
    assert learner.status["phase"] == "COMPLETED"


def test_the_log_stops_at_its_cap_with_one_marker_line(tmp_path: Path) -> None:
    # 1000 lines of 10 bytes (newline included); 100 bytes allowed: the first 10 are kept.
    script = "for i in range(1000): print('line %04d' % i, flush=i % 7 == 0)"
    learner = Learner(tmp_path, ["-c", script], max_log_bytes=100)
    assert learner.run() == 0, learner.stderr
    marker = "[dlaas] log truncated: the plan allows 100 bytes of log per training learner"
    expected = [f"line {i:04d}" for i in range(10)] + [marker]
    assert [r.line for r in learner.records()] == expected
    assert learner.uploaded_log_lines() == expected
    assert learner.status["exit_code"] == 0


def test_without_a_cap_the_log_is_whole(tmp_path: Path) -> None:
    learner = Learner(tmp_path, ["-c", "for i in range(1000): print('line %04d' % i)"])
    assert learner.run() == 0, learner.stderr
    assert [r.line for r in learner.records()] == [f"line {i:04d}" for i in range(1000)]
