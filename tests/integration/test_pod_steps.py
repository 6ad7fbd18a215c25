"""A learner pod's three steps as real processes on this machine, without a cluster: the
directories the pod's volumes would be are directories in tmp_path, the log store is the
real Redis at 127.0.0.1:6379, the object stores are a local one or moto's S3 server.

Every `run` step runs as in the runtime's image: `python -S` (no site-packages) with a
copy of the `worker.learner` package alone on the path, so any import beyond the
standard library fails the test that takes that path."""

from __future__ import annotations

import dataclasses
import io
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.domain.metrics import parse_log_metrics_document, parse_tensorboard_document
from service.domain.records import Secret
from service.logs.base import LogRecord
from service.logs.config import LogSinkConfig
from service.logs.redis import RedisLogStore
from service.storage import keys
from service.storage.config import BucketLocation, StoreConfig
from service.storage.local import LocalObjectStore
from service.storage.scoped import TrainingScope, scoped_store, training_policy
from tests.integration import test_scoped_store as scoped_case
from tests.integration.platform_harness import kill_tree
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, free_port, moto_server
from worker.learner import pod_io, pod_run
from worker.learner.spec import LearnerSpec

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
REDIS = "redis://127.0.0.1:6379/15"
ARCHIVE_KEY = "trainings/{}/model_definition.zip"
PREFIX = "trainings/{}/results/"

SCRIPTS = {
    "tb.py": """
        import os, time
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        writer = EventFileWriter(os.path.join(os.environ["LOG_DIR"], "train"))
        def scalar(step):
            summary = scalar_pb("loss", 1 / (step + 1))
            writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
            writer.flush()
        scalar(0)
        while not os.path.exists("go"):  # the test says go once it saw step 0 stored
            time.sleep(0.05)
        scalar(1)
        writer.close()
    """,
    "metrics.py": """
        import os, time
        print("step 0 loss=1.0", flush=True)
        while not os.path.exists("go"):  # the test says go once it saw step 0 stored
            time.sleep(0.05)
        print("x" * (64 * 1024 - 8) + " step 1 loss=0.5", flush=True)  # cut by the tee
        print("done", flush=True)
    """,
    "train.py": """
        import os, sys
        print("hello from learner", os.environ["LEARNER_ID"], flush=True)
        print("a line on stderr", file=sys.stderr, flush=True)
        res, logs = os.environ["RESULT_DIR"], os.environ["LOG_DIR"]
        os.makedirs(f"{res}/model")
        open(f"{res}/model/saved_model.pb", "w").write("pb")
        os.makedirs(f"{logs}/tb")
        open(f"{logs}/tb/events.out", "w").write("ev")
        open(f"{res}/cwd.txt", "w").write(os.getcwd())
        for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 100):
            print(f"line {i}", flush=i % 13 == 0)
    """,
    "lines.py": """
        import random, sys, time
        random.seed(11)
        sizes = [0, 1, 50, 4000, 20000]
        lines = ["x" * random.choice(sizes) + f" #{i} é" for i in range(400)]
        data = "".join(line + "\\n" for line in lines).encode()
        data += b"y" * 70000 + b"|end\\n"
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
    "exit.py": """
        import os, signal, sys
        print("about to end:", sys.argv[1], flush=True)
        open(os.path.join(os.environ["LOG_DIR"], "debug.txt"), "w").write("dbg")
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(int(sys.argv[1]))
    """,
    "ckpt.py": """
        import os, sys
        ckpt = os.environ["CHECKPOINT_DIR"]
        found = sorted(
            os.path.relpath(os.path.join(d, f), ckpt) for d, _, fs in os.walk(ckpt) for f in fs
        )
        print("restored:", ",".join(found), flush=True)
        os.makedirs(f"{ckpt}/step-2", exist_ok=True)
        open(f"{ckpt}/step-2/model.ckpt", "w").write("two")
        open(f"{ckpt}/latest", "w").write("step-2")
        os.symlink("/etc/hostname", f"{ckpt}/outside")  # a link out of it: never saved
        os.mkfifo(f"{ckpt}/fifo")  # nor anything but regular files
        if sys.argv[1:] == ["wait"]:
            import time
            print("saved step 2", flush=True)
            time.sleep(60)
        sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
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
}


def zip_bytes(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, textwrap.dedent(text))
    return buf.getvalue()


@pytest.fixture(scope="module")
def stdlib_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the `worker.learner` package alone: what a learner image holds of DLaaS."""
    root = tmp_path_factory.mktemp("learner-image")
    (root / "worker").mkdir()
    shutil.copy(REPO / "worker" / "__init__.py", root / "worker" / "__init__.py")
    shutil.copytree(
        REPO / "worker" / "learner",
        root / "worker" / "learner",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return root


@pytest.fixture
def redis_logs() -> Iterator[RedisLogStore]:
    store = RedisLogStore(REDIS)
    yield store
    store.close()


class Pod:
    """One learner pod's volumes in tmp_path, its spec, and its steps as processes."""

    def __init__(self, tmp: Path, stdlib_path: Path, **overrides: Any) -> None:
        self.tmp = tmp
        self.stdlib_path = stdlib_path
        self.training_id = f"pod-test-{os.getpid()}-{time.monotonic_ns()}"
        self.prefix = PREFIX.format(self.training_id)
        self.store = LocalObjectStore(tmp / "store")
        archive_key = ARCHIVE_KEY.format(self.training_id)
        (tmp / "code.zip").write_bytes(zip_bytes(SCRIPTS))
        self.store.put_file(archive_key, tmp / "code.zip")
        self.io = tmp / "io"
        work = tmp / "job"
        self.dirs = {
            "MODEL_DIR": str(work / "model-code"),
            "DATA_DIR": str(work / "data"),
            "RESULT_DIR": str(work / "results"),
            "LOG_DIR": str(work / "logs"),
            "CHECKPOINT_DIR": str(work / "checkpoints"),
            "HOME": str(work / "home"),
        }
        self.env = {"LEARNER_ID": "1", "NUM_LEARNERS": "1", "TRAINING_ID": self.training_id}
        self.env |= self.dirs
        fields: dict[str, Any] = {
            "training_id": self.training_id,
            "learner_id": 1,
            "num_learners": 1,
            "hostname": "learner-1",
            "argv": [],
            "env": self.env,
            "model_dir": self.dirs["MODEL_DIR"],
            "data_dir": self.dirs["DATA_DIR"],
            "result_dir": self.dirs["RESULT_DIR"],
            "log_dir": self.dirs["LOG_DIR"],
            "checkpoint_dir": self.dirs["CHECKPOINT_DIR"],
            "model_definition_key": archive_key,
            "store": StoreConfig(kind="local", root=str(tmp / "store")),
            "log_sink": LogSinkConfig(kind="redis", url=REDIS),
            "results_prefix": self.prefix,
        }
        fields.update(overrides)
        self.spec = LearnerSpec(**fields)
        self.spec_path = tmp / "spec" / "learner-1.json"
        self.spec.write(self.spec_path)
        self.agent: subprocess.Popen[bytes] | None = None
        self.runner: subprocess.Popen[bytes] | None = None

    def termination(self, step: str) -> Path:
        return self.tmp / f"termination-{step}"

    def step(self, step: str, *args: str) -> list[str]:
        return [
            sys.executable, "-m", "worker.learner.pod", step,
            "--termination-log", str(self.termination(step)), *args,
        ]  # fmt: skip

    def fetch(self) -> subprocess.CompletedProcess[str]:
        argv = self.step("fetch", str(self.spec_path), "--private-dir", str(self.tmp / "fetch"))
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)

    def start_agent(self) -> subprocess.Popen[bytes]:
        argv = self.step(
            "agent", str(self.spec_path), "--io", str(self.io),
            "--private-dir", str(self.tmp / "agent"),
        )  # fmt: skip
        self.agent = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE)
        return self.agent

    def run_step(self, argv: list[str], *options: str) -> tuple[list[str], dict[str, str]]:
        """The learner container's command and environment: no site-packages, only the
        copied package on the path, the pod's environment."""
        command = self.step("run", "--io", str(self.io), *options, "--", *argv)
        command.insert(1, "-S")
        # No bytecode written: the image's package is read-only (readOnlyRootFilesystem).
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(self.stdlib_path),
            "PYTHONDONTWRITEBYTECODE": "1",
            **self.env,
        }
        Path(self.dirs["MODEL_DIR"]).mkdir(parents=True, exist_ok=True)
        return command, env

    def start_run(self, argv: list[str], *options: str) -> subprocess.Popen[bytes]:
        """The learner container, in the model directory (its working directory)."""
        command, env = self.run_step(argv, *options)
        self.runner = subprocess.Popen(
            command,
            cwd=self.dirs["MODEL_DIR"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return self.runner

    def script(self, name: str, *args: str) -> list[str]:
        return [sys.executable, name, *args]

    def run_to_end(self, argv: list[str], *options: str, timeout: float = 60) -> int:
        """Fetch, then the agent beside the learner container, as the pod runs them;
        returns run's exit code once the agent has stored (the kubelet then stops it)."""
        fetched = self.fetch()
        assert fetched.returncode == 0, fetched.stderr
        self.start_agent()
        runner = self.start_run(argv, *options)
        out, err = runner.communicate(timeout=timeout)
        self.stdout, self.stderr = out, err.decode(errors="replace")
        return runner.returncode

    def stop_agent(self) -> int:
        assert self.agent is not None
        self.agent.send_signal(signal.SIGTERM)
        _, err = self.agent.communicate(timeout=20)
        self.agent_stderr = err.decode(errors="replace")
        return self.agent.returncode

    def kill(self) -> None:
        """Whatever is left of the pod, gone: the steps and the command `run` supervises
        (in a process group of its own), as the pod's end takes every container's processes."""
        for proc in (self.runner, self.agent):
            if proc is not None:
                kill_tree(proc)

    def keys(self) -> set[str]:
        return {info.key for info in self.store.list(self.prefix)}

    def object_text(self, key: str) -> str:
        with self.store.open(key) as f:
            return f.read().decode()

    def uploaded_log_lines(self) -> list[str]:
        text = self.object_text(f"{self.prefix}learner-1/training-log.txt")
        return [line.split(" ", 1)[1] for line in text.split("\n")[:-1]]

    def records(self, logs: RedisLogStore) -> list[LogRecord]:
        return logs.read(self.training_id, limit=1_000_000)[0]


@pytest.fixture
def pod(tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore) -> Iterator[Pod]:
    p = Pod(tmp_path, stdlib_path)
    yield p
    p.kill()
    redis_logs.delete(p.training_id)


def live_in_group(pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,stat="], capture_output=True, text=True)
    return sorted(
        int(pid)
        for pid, group, state in (line.split(None, 2) for line in out.stdout.splitlines())
        if int(group) == pgid and not state.startswith("Z")
    )


def wait_until(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- fetch -----------------------------------------------------------------------------

DATA = {
    "train/a.txt": b"alpha",
    "train/sub/b.bin": os.urandom(200 * 1024),
    "other/c.txt": b"elsewhere",
}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        server.make_bucket("platform")
        server.make_bucket("user-data", DATA)
        yield server


def s3_store(s3: S3Server, bucket: str) -> StoreConfig:
    return StoreConfig(
        kind="s3",
        endpoint=s3.url,
        access_key=Secret(ACCESS_KEY),
        secret_key=Secret(SECRET_KEY),
        bucket=bucket,
    )


def test_fetch_puts_the_code_and_the_data_in_place_from_s3(
    tmp_path: Path, stdlib_path: Path, s3: S3Server
) -> None:
    platform = s3_store(s3, "platform")
    user = StoreConfig(
        kind="s3",
        endpoint=s3.url,
        access_key=Secret("AKIA-USER"),
        secret_key=Secret("user-secret"),
        bucket="user-data",
        allowed_endpoints=(s3.netloc,),
    )
    pod = Pod(
        tmp_path,
        stdlib_path,
        store=platform,
        training_data=BucketLocation(store=user, prefix="train/"),
    )
    archive = zip_bytes(SCRIPTS)
    s3.client().put_object(
        "platform", pod.spec.model_definition_key, io.BytesIO(archive), len(archive)
    )
    fetched = pod.fetch()
    assert fetched.returncode == 0, fetched.stderr
    assert "downloaded the training data" in fetched.stdout
    model = Path(pod.dirs["MODEL_DIR"])
    assert sorted(p.name for p in model.iterdir()) == sorted(SCRIPTS)
    data = Path(pod.dirs["DATA_DIR"])
    assert (data / "a.txt").read_bytes() == DATA["train/a.txt"]
    assert (data / "sub" / "b.bin").read_bytes() == DATA["train/sub/b.bin"]
    assert not (data / "c.txt").exists() and not (data / "other").exists()
    for name in ("RESULT_DIR", "LOG_DIR", "CHECKPOINT_DIR", "HOME"):
        assert Path(pod.dirs[name]).is_dir(), name
    assert not pod.termination("fetch").exists()
    # Nothing of the step's own is left where the learner container looks.
    assert not any((tmp_path / "fetch").iterdir())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_definition_key": "trainings/x/missing.zip"}, "is not in the object store"),
        ({"store": StoreConfig(kind="s3", bucket="b")}, "names an S3 store without an endpoint"),
        ({"log_sink": LogSinkConfig(kind="redis")}, "the learner spec's log sink is unusable"),
    ],
)
def test_a_failed_fetch_exits_non_zero_with_its_reason(
    tmp_path: Path, stdlib_path: Path, overrides: dict[str, Any], message: str
) -> None:
    pod = Pod(tmp_path, stdlib_path, **overrides)
    fetched = pod.fetch()
    assert fetched.returncode == 2
    reason = pod.termination("fetch").read_text()
    assert message in reason
    assert reason in fetched.stderr
    assert not Path(pod.dirs["MODEL_DIR"]).exists()


def test_fetch_of_an_unreadable_spec_says_so(tmp_path: Path, stdlib_path: Path) -> None:
    pod = Pod(tmp_path, stdlib_path)
    pod.spec_path.write_text('{"training_id": 1}')
    assert pod.fetch().returncode == 2
    assert "cannot be read" in pod.termination("fetch").read_text()


# -- run and agent ------------------------------------------------------------------------


def test_a_run_sends_every_line_in_order_and_stores_results_and_logs(
    pod: Pod, redis_logs: RedisLogStore
) -> None:
    code = pod.run_to_end(pod.script("train.py", "300"))
    assert code == 0, pod.stderr
    assert pod.keys() == {
        f"{pod.prefix}model/saved_model.pb",
        f"{pod.prefix}cwd.txt",
        f"{pod.prefix}learner-1/training-log.txt",
        f"{pod.prefix}learner-1/logs/tb/events.out",
    }
    assert pod.object_text(f"{pod.prefix}cwd.txt") == pod.dirs["MODEL_DIR"]
    expected = ["hello from learner 1", *(f"line {i}" for i in range(300))]
    uploaded = pod.uploaded_log_lines()
    assert [line for line in uploaded if line != "a line on stderr"] == expected
    assert "a line on stderr" in uploaded
    records = pod.records(redis_logs)
    assert [r.line for r in records] == uploaded
    assert {r.learner for r in records} == {1}
    # The same lines on run's own stdout: the pod log, the fallback.
    assert pod.stdout.decode().splitlines() == uploaded
    assert pod_io.Stored.read(pod.io) == pod_io.Stored(True)
    assert pod_io.Exit.read(pod.io) == pod_io.Exit(0)
    assert not pod.termination("run").exists()
    # The agent waits to be stopped (a native sidecar), then ends cleanly.
    assert pod.agent is not None and pod.agent.poll() is None
    assert pod.stop_agent() == 0


def test_lines_survive_arbitrary_writes_and_segment_changes(
    pod: Pod, redis_logs: RedisLogStore
) -> None:
    code = pod.run_to_end(pod.script("lines.py"), "--segment-bytes", "50000")
    assert code == 0, pod.stderr
    random.seed(11)
    sizes = [0, 1, 50, 4000, 20000]
    expected = ["x" * random.choice(sizes) + f" #{i} é" for i in range(400)]
    expected += ["y" * 65536, "y" * (70000 - 65536) + "|end"]  # longer than 64 KiB: cut
    expected += ["crlf line", "no newline at the end"]
    assert [r.line for r in pod.records(redis_logs)] == expected
    assert pod.uploaded_log_lines() == expected
    # The agent deleted every segment it had read but the last.
    segments = sorted(p.name for p in pod.io.glob(f"{pod_io.SEGMENT_PREFIX}*"))
    assert len(segments) == 1 and segments[0] != f"{pod_io.SEGMENT_PREFIX}000000"


@pytest.mark.parametrize(("how", "code"), [("0", 0), ("3", 3), ("kill", 128 + signal.SIGKILL)])
def test_the_commands_exit_code_is_runs_exit_code(
    pod: Pod, redis_logs: RedisLogStore, how: str, code: int
) -> None:
    assert pod.run_to_end(pod.script("exit.py", how)) == code, pod.stderr
    assert pod_io.Exit.read(pod.io) == pod_io.Exit(code)
    # A failed command's logs are stored all the same, and it leaves no termination
    # message: its exit code says it all.
    assert pod.keys() == {
        f"{pod.prefix}learner-1/training-log.txt",
        f"{pod.prefix}learner-1/logs/debug.txt",
    }
    assert [r.line for r in pod.records(redis_logs)] == [f"about to end: {how}"]
    assert not pod.termination("run").exists()


def test_the_log_stops_at_its_cap_with_one_marker_line(
    tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore
) -> None:
    pod = Pod(tmp_path, stdlib_path, max_log_bytes=100)
    try:
        script = ["-c", "for i in range(1000): print('line %04d' % i, flush=i % 7 == 0)"]
        assert pod.run_to_end([sys.executable, *script]) == 0, pod.stderr
        marker = "[dlaas] log truncated: the plan allows 100 bytes of log per training learner"
        expected = [*(f"line {i:04d}" for i in range(10)), marker]
        assert [r.line for r in pod.records(redis_logs)] == expected
        assert pod.uploaded_log_lines() == expected
    finally:
        pod.kill()
        redis_logs.delete(pod.training_id)


def test_a_wait_for_that_times_out_fails_naming_the_endpoint(
    pod: Pod, redis_logs: RedisLogStore
) -> None:
    port = free_port()  # nothing listens there
    closed = f"127.0.0.1:{port}"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        open_ = f"127.0.0.1:{listening.getsockname()[1]}"
        started = time.monotonic()
        code = pod.run_to_end(
            pod.script("train.py"),
            "--wait-for", open_, "--wait-for", closed, "--wait-for", "no-such-host.invalid:2222",
            "--wait-timeout", "1.5",
        )  # fmt: skip
    assert code == pod_run.EXIT_PEERS_UNREACHABLE
    assert time.monotonic() - started < 15
    reason = pod.termination("run").read_text()
    assert "did not accept connections within 1.5 s" in reason
    assert f"still missing: {closed}, no-such-host.invalid:2222" in reason
    assert open_ not in reason
    # The learner's log says so too; the command never ran.
    assert [r.line for r in pod.records(redis_logs)] == [f"[dlaas] {reason}"]
    assert not Path(pod.dirs["RESULT_DIR"], "cwd.txt").exists()


def test_a_wait_for_proceeds_once_the_peer_listens(pod: Pod) -> None:
    port = free_port()
    listening = socket.socket()

    def listen_later() -> None:
        time.sleep(1.0)
        listening.bind(("127.0.0.1", port))
        listening.listen()

    threading.Thread(target=listen_later).start()
    try:
        started = time.monotonic()
        code = pod.run_to_end(pod.script("train.py", "1"), "--wait-for", f"127.0.0.1:{port}")
        assert code == 0, pod.stderr
        assert time.monotonic() - started >= 1.0
    finally:
        listening.close()


@pytest.mark.parametrize("mode", ["trap", "polite"])
def test_sigterm_to_run_stops_the_whole_command(
    pod: Pod, redis_logs: RedisLogStore, mode: str
) -> None:
    assert pod.fetch().returncode == 0
    pod.start_agent()
    runner = pod.start_run(pod.script("stop.py", mode), "--grace", "4")

    def ready() -> list[str]:
        return [r.line for r in pod.records(redis_logs) if r.line.startswith("ready ")]

    wait_until(lambda: bool(ready()), timeout=20)
    _, pid, child = ready()[0].split()
    assert live_in_group(int(pid)) == sorted([int(pid), int(child)])
    started = time.monotonic()
    runner.send_signal(signal.SIGTERM)
    code = runner.wait(timeout=20)
    elapsed = time.monotonic() - started
    expected = 128 + (signal.SIGKILL if mode == "trap" else signal.SIGTERM)
    assert code == expected
    # Polite: it stopped on TERM, no need to wait out the grace; trap: killed after it.
    if mode == "trap":
        assert 4 <= elapsed < 4 + 5
    else:
        assert elapsed < 3
    assert live_in_group(int(pid)) == []
    assert pod_io.Exit.read(pod.io) == pod_io.Exit(expected, stopped=True)
    # Stopped: the log alone is stored, as the local wrapper does.
    assert pod.keys() == {f"{pod.prefix}learner-1/training-log.txt"}
    if mode == "trap":
        assert "got SIGTERM, ignoring" in pod.uploaded_log_lines()
    assert pod.stop_agent() == 0


def test_sigterm_to_the_agent_stops_following_and_stores_the_log(
    pod: Pod, redis_logs: RedisLogStore
) -> None:
    assert pod.fetch().returncode == 0
    agent = pod.start_agent()
    pod.start_run(pod.script("stop.py", "polite"))
    wait_until(lambda: any(r.line.startswith("ready ") for r in pod.records(redis_logs)), 20)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 143
    assert pod.keys() == {f"{pod.prefix}learner-1/training-log.txt"}
    assert pod.uploaded_log_lines()[0].startswith("ready ")
    # No answer for an exit it has not seen: run, were it left running, would not take
    # the log alone for its results.
    assert pod_io.Stored.read(pod.io) is None


def test_run_installs_the_key_pair_with_the_modes_ssh_insists_on(pod: Pod) -> None:
    keys_dir = pod.tmp / "ssh"
    keys_dir.mkdir()
    for name in pod_run.SSH_KEY_NAMES:
        (keys_dir / name).write_text(f"{name} contents\n")
        (keys_dir / name).chmod(0o400)
    check = (
        "import os, stat; h = os.environ['HOME'] + '/.ssh'; "
        "print(oct(stat.S_IMODE(os.stat(h).st_mode)), "
        "*sorted((n, oct(stat.S_IMODE(os.stat(h + '/' + n).st_mode)), open(h + '/' + n).read())"
        " for n in os.listdir(h)))"
    )
    assert pod.run_to_end([sys.executable, "-c", check], "--ssh-dir", str(keys_dir)) == 0
    home_ssh = Path(pod.dirs["HOME"]) / ".ssh"
    assert stat.S_IMODE(home_ssh.stat().st_mode) == 0o700
    for name in pod_run.SSH_KEY_NAMES:
        copied = home_ssh / name
        assert copied.read_text() == f"{name} contents\n"
        assert stat.S_IMODE(copied.stat().st_mode) == 0o600


def test_a_command_that_cannot_start_fails_with_its_own_code(pod: Pod) -> None:
    assert pod.run_to_end(["/nonexistent/python"]) == pod_run.EXIT_CANNOT_START
    assert "learner 1 could not start its command" in pod.termination("run").read_text()
    assert pod.keys() == {f"{pod.prefix}learner-1/training-log.txt"}


def test_a_store_that_fails_fails_a_successful_run(pod: Pod) -> None:
    assert pod.fetch().returncode == 0
    pod.start_agent()
    # The store breaks while the command runs: nothing can be put under trainings/.
    store = pod.tmp / "store"
    (store / "trainings").rename(store / "trainings-gone")
    (store / "trainings").write_text("not a directory")
    runner = pod.start_run(pod.script("train.py", "3"))
    assert runner.wait(timeout=60) == pod_run.EXIT_NOT_STORED
    reason = pod.termination("run").read_text()
    assert reason.startswith(f"learner 1 could not store its files: {pod.prefix}")
    stored = pod_io.Stored.read(pod.io)
    assert stored is not None and not stored.ok and stored.reason is not None
    assert stored.reason in reason


def test_run_does_not_wait_forever_for_a_missing_agent(pod: Pod) -> None:
    assert pod.fetch().returncode == 0
    runner = pod.start_run(pod.script("exit.py", "0"), "--store-timeout", "1")
    assert runner.wait(timeout=20) == pod_run.EXIT_NOT_STORED
    reason = pod.termination("run").read_text()
    assert reason == "learner 1 could not store its files: the agent did not store them within 1 s"


def test_an_agent_that_cannot_work_answers_at_once(pod: Pod) -> None:
    assert pod.fetch().returncode == 0
    pod.spec_path.write_text("not json")
    agent = pod.start_agent()
    assert agent.wait(timeout=20) == 2
    runner = pod.start_run(pod.script("exit.py", "3"))
    assert runner.wait(timeout=20) == 3  # the command's failure comes first
    assert "cannot be read" in pod.termination("agent").read_text()
    run_reason = pod.termination("run").read_text()
    assert run_reason.startswith("learner 1 exited with code 3; storing its files also failed")


def test_sigterm_while_waiting_for_peers_ends_at_once(pod: Pod) -> None:
    assert pod.fetch().returncode == 0
    pod.start_agent()
    runner = pod.start_run(pod.script("train.py"), "--wait-for", f"127.0.0.1:{free_port()}")
    time.sleep(1.0)  # past the imports, into the wait
    assert runner.poll() is None
    started = time.monotonic()
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=20) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 3
    assert pod_io.Exit.read(pod.io) == pod_io.Exit(128 + signal.SIGTERM, stopped=True)
    assert not Path(pod.dirs["RESULT_DIR"], "cwd.txt").exists()
    assert not pod.termination("run").exists()


def _new_pid_namespace() -> bool:
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _new_pid_namespace(), reason="cannot make a PID namespace here")
def test_as_pid_1_run_reaps_orphans_and_keeps_the_commands_code(pod: Pod) -> None:
    """In its container run is PID 1 and inherits every orphan: none stays a zombie."""
    script = (
        "(sleep 0.2 &); (sleep 0.2 &); sleep 1.5; "
        "echo zombies $(grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l); exit 5"
    )
    command, env = pod.run_step(["sh", "-c", script], "--store-timeout", "0.5")
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *command],
        cwd=pod.dirs["MODEL_DIR"],
        env=env,
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout.decode().splitlines() == ["zombies 0"]


def test_a_full_io_volume_never_blocks_the_command(pod: Pod, redis_logs: RedisLogStore) -> None:
    """Past what io can take (here a file size limit on run), the output still goes to the
    pod log and the command runs to its end."""
    import resource

    assert pod.fetch().returncode == 0
    pod.start_agent()
    command, env = pod.run_step([sys.executable, "-c", "for i in range(5000): print(i)"])
    limit = 1000
    done = subprocess.run(
        command,
        cwd=pod.dirs["MODEL_DIR"],
        env=env,
        capture_output=True,
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == [str(i) for i in range(5000)]
    assert b"failed" in done.stderr
    # What io took: the first lines, the last one perhaps cut where the limit fell.
    lines = [r.line for r in pod.records(redis_logs)]
    assert lines[:-1] == [str(i) for i in range(len(lines) - 1)]
    assert str(len(lines) - 1).startswith(lines[-1])
    assert len("\n".join(lines)) == limit


def test_an_io_volume_that_cannot_be_written_fails_the_start(pod: Pod) -> None:
    pod.io.write_text("not a directory")
    runner = pod.start_run(pod.script("exit.py", "0"))
    _, err = runner.communicate(timeout=20)
    assert runner.returncode == pod_run.EXIT_CANNOT_START, err
    assert "its output cannot go to" in pod.termination("run").read_text()


# -- checkpoints between attempts ---------------------------------------------------------

CKPT = "trainings/{}/checkpoints/attempt-{}/"


def ckpt_pod(tmp_path: Path, stdlib_path: Path, attempt: int, **overrides: Any) -> Pod:
    """Learner 1's pod in the given attempt of its training, saving its
    CHECKPOINT_DIR where the Kubernetes backend has it saved."""
    pod = Pod(tmp_path, stdlib_path, **overrides)
    pod.spec = dataclasses.replace(
        pod.spec, checkpoints_prefix=CKPT.format(pod.training_id, attempt) + "learner-1/"
    )
    pod.spec.write(pod.spec_path)
    return pod


def saved(pod: Pod, prefix: str) -> dict[str, str]:
    return {info.key[len(prefix) :]: pod.object_text(info.key) for info in pod.store.list(prefix)}


@pytest.mark.parametrize("code", [0, 3])
def test_the_agent_saves_checkpoint_dir_when_the_command_ends(
    tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore, code: int
) -> None:
    pod = ckpt_pod(tmp_path, stdlib_path, 1)
    try:
        assert pod.run_to_end(pod.script("ckpt.py", str(code))) == code, pod.stderr
        prefix = CKPT.format(pod.training_id, 1)
        # Regular files only: the link out of CHECKPOINT_DIR and the FIFO are not saved.
        assert saved(pod, prefix) == {
            "learner-1/step-2/model.ckpt": "two",
            "learner-1/latest": "step-2",
        }
        assert pod.stop_agent() == 0
    finally:
        pod.kill()
        redis_logs.delete(pod.training_id)


def test_the_agent_saves_checkpoint_dir_when_stopped(
    tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore
) -> None:
    pod = ckpt_pod(tmp_path, stdlib_path, 2)
    try:
        assert pod.fetch().returncode == 0
        agent = pod.start_agent()
        pod.start_run(pod.script("ckpt.py", "wait"))
        wait_until(lambda: any(r.line == "saved step 2" for r in pod.records(redis_logs)), 20)
        agent.send_signal(signal.SIGTERM)  # the pod deleted: a stop, or the next attempt
        assert agent.wait(timeout=20) == 143
        assert saved(pod, CKPT.format(pod.training_id, 2)) == {
            "learner-1/step-2/model.ckpt": "two",
            "learner-1/latest": "step-2",
        }
    finally:
        pod.kill()
        redis_logs.delete(pod.training_id)


def test_fetch_restores_the_learners_part_of_the_last_attempts_checkpoints(
    tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore
) -> None:
    """Attempt 2 of learner 1 finds what learner 1 of attempt 1 saved (not learner 2's),
    and saves its own under attempt 2."""
    pod = ckpt_pod(tmp_path, stdlib_path, 2)
    last = CKPT.format(pod.training_id, 1)
    for key, text in {
        "learner-1/step-1/model.ckpt": "one",
        "learner-1/latest": "step-1",
        "learner-2/theirs": "no",
    }.items():
        (tmp_path / "obj").write_text(text)
        pod.store.put_file(last + key, tmp_path / "obj")
    pod.spec = dataclasses.replace(pod.spec, restore_checkpoints=last)
    pod.spec.write(pod.spec_path)
    try:
        fetched = pod.fetch()
        assert fetched.returncode == 0, fetched.stderr
        assert "restored 2 checkpoint files of the last attempt" in fetched.stdout
        pod.start_agent()
        runner = pod.start_run(pod.script("ckpt.py"))
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 0, err
        restored = [r.line for r in pod.records(redis_logs) if r.line.startswith("restored:")]
        assert restored == ["restored: latest,step-1/model.ckpt"]
        assert saved(pod, CKPT.format(pod.training_id, 2)) == {
            "learner-1/step-1/model.ckpt": "one",
            "learner-1/step-2/model.ckpt": "two",
            "learner-1/latest": "step-2",
        }
    finally:
        pod.kill()
        redis_logs.delete(pod.training_id)


def test_fetch_restores_a_shared_checkpoint_dir_whole(tmp_path: Path, stdlib_path: Path) -> None:
    """Checkpoints saved as one CHECKPOINT_DIR (no learner-<i>/ folders, the local
    backend's layout) are every learner's."""
    pod = Pod(tmp_path, stdlib_path)
    last = f"trainings/{pod.training_id}/checkpoints/attempt-1/"
    for key in ("model.ckpt", "sub/learner-1.idx"):
        (tmp_path / "obj").write_text(key)
        pod.store.put_file(last + key, tmp_path / "obj")
    pod.spec = dataclasses.replace(pod.spec, restore_checkpoints=last)
    pod.spec.write(pod.spec_path)
    fetched = pod.fetch()
    assert fetched.returncode == 0, fetched.stderr
    ckpt = Path(pod.dirs["CHECKPOINT_DIR"])
    assert (ckpt / "model.ckpt").read_text() == "model.ckpt"
    assert (ckpt / "sub" / "learner-1.idx").read_text() == "sub/learner-1.idx"


def test_a_restore_that_fails_fails_the_fetch(tmp_path: Path, stdlib_path: Path) -> None:
    pod = Pod(tmp_path, stdlib_path, restore_checkpoints="trainings/x/checkpoints/attempt-1/")
    (tmp_path / "obj").write_text("x")
    pod.store.put_file("trainings/x/checkpoints/attempt-1/sub/ckpt", tmp_path / "obj")
    Path(pod.dirs["CHECKPOINT_DIR"]).mkdir(parents=True)
    (Path(pod.dirs["CHECKPOINT_DIR"]) / "sub").write_text("a file where a directory goes")
    fetched = pod.fetch()
    assert fetched.returncode == 2
    assert "the checkpoints of the last attempt could not be restored" in (
        pod.termination("fetch").read_text()
    )


def test_the_steps_work_within_the_training_s_scoped_credentials(
    tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore
) -> None:
    """fetch, run and agent with the credentials the Kubernetes backend puts in the Secret
    under DLAAS_STORE_ROLE_ARN, on a moto server enforcing access control with the
    training's policy on the role (moto ignores session policies: see
    tests/integration/test_scoped_store.py): every request the steps make is one the
    policy allows; an object outside the training's keys stays unreadable to them."""
    with moto_server(env=scoped_case.ENFORCING) as server:
        key = scoped_case.platform_user(server)
        platform = dataclasses.replace(
            s3_store(server, "platform"), access_key=Secret(key[0]), secret_key=Secret(key[1])
        )
        pod = Pod(tmp_path, stdlib_path, store=platform)
        scope = TrainingScope(
            training_id=pod.training_id,
            read_keys=(pod.spec.model_definition_key,),
            read_prefixes=(),
            write_prefixes=(pod.prefix, keys.attempt_checkpoints_prefix(pod.training_id, 1)),
        )
        scoped_case.make_role(server, key, training_policy("platform", scope))
        client = server.client(*key)
        client.make_bucket("platform")
        archive = zip_bytes(SCRIPTS)
        client.put_object(
            "platform", pod.spec.model_definition_key, io.BytesIO(archive), len(archive)
        )
        pod.spec = dataclasses.replace(
            pod.spec, store=scoped_store(platform, scoped_case.ROLE_ARN, scope, 3600)
        )
        pod.spec.write(pod.spec_path)
        try:
            assert pod.run_to_end(pod.script("train.py", "5")) == 0, pod.stderr
            assert pod.stop_agent() == 0, pod.agent_stderr
        finally:
            pod.kill()
        stored = {o.object_name for o in client.list_objects("platform", pod.prefix, True)}
        assert stored == {
            f"{pod.prefix}model/saved_model.pb",
            f"{pod.prefix}cwd.txt",
            f"{pod.prefix}learner-1/training-log.txt",
            f"{pod.prefix}learner-1/logs/tb/events.out",
        }
        other = dataclasses.replace(pod.spec, model_definition_key="trainings/other/x.zip")
        client.put_object("platform", other.model_definition_key, io.BytesIO(archive), 4)
        other.write(pod.spec_path)
        assert pod.fetch().returncode == 2
        assert "refused access" in pod.termination("fetch").read_text()


def test_the_agent_syncs_log_dir_and_tensorboard_scalars_while_the_command_runs(
    tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore
) -> None:
    pod = Pod(tmp_path, stdlib_path, log_dir_sync_seconds=0.2, tensorboard_metrics=True)
    metrics_key = keys.tensorboard_metrics_key(pod.training_id, 1)

    def steps() -> list[int]:
        if pod.store.stat(metrics_key) is None:
            return []
        with pod.store.open(metrics_key) as f:
            return [p.step for p in parse_tensorboard_document(f.read())["train/loss"]]

    try:
        assert pod.fetch().returncode == 0
        pod.start_agent()
        runner = pod.start_run(pod.script("tb.py"))
        deadline = time.monotonic() + 60
        while steps() != [0]:
            assert runner.poll() is None and time.monotonic() < deadline, runner.stderr
            time.sleep(0.05)
        # While the command runs: its event file is in the results, its step 0 a metric.
        stored = pod.keys()
        assert any(k.startswith(f"{pod.prefix}learner-1/logs/train/") for k in stored)
        (Path(pod.dirs["MODEL_DIR"]) / "go").touch()
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 0, err.decode(errors="replace")
        assert steps() == [0, 1]  # the agent's last pass, before it stored
        assert pod.stop_agent() == 0
    finally:
        pod.kill()
        redis_logs.delete(pod.training_id)


def test_the_agent_stores_the_metric_regexes_points_while_the_command_runs(
    tmp_path: Path, stdlib_path: Path, redis_logs: RedisLogStore
) -> None:
    """On Kubernetes the agent tees the output: it finds the manifest's metric regexes in
    it as it goes, and stores them with its LOG_DIR syncs and at the end, a line the tee
    cut searched whole."""
    pod = Pod(
        tmp_path,
        stdlib_path,
        log_dir_sync_seconds=0.2,
        log_metrics=(("loss", r"loss=([0-9.]+)"),),
    )
    metrics_key = keys.log_metrics_key(pod.training_id, 1)

    def points() -> list[tuple[int | None, float]]:
        if pod.store.stat(metrics_key) is None:
            return []
        with pod.store.open(metrics_key) as f:
            return [(p.step, p.value) for p in parse_log_metrics_document(f.read())["loss"]]

    try:
        assert pod.fetch().returncode == 0
        pod.start_agent()
        runner = pod.start_run(pod.script("metrics.py"))
        deadline = time.monotonic() + 60
        while points() != [(0, 1.0)]:
            assert runner.poll() is None and time.monotonic() < deadline, runner.stderr
            time.sleep(0.05)
        (Path(pod.dirs["MODEL_DIR"]) / "go").touch()
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 0, err.decode(errors="replace")
        assert points() == [(0, 1.0), (1, 0.5)]  # the agent's last store, before it answered
        assert pod.stop_agent() == 0
    finally:
        pod.kill()
        redis_logs.delete(pod.training_id)
