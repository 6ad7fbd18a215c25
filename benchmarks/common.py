"""What every benchmark shares: a platform to measure, a tenant, rows in the contract shape.

Each benchmark starts what it needs itself (a `dlaas up` on a temporary DLAAS_HOME by
default) and compares against a baseline measured in the same run, so that the noise of a
shared machine cancels out in the ratio.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# A training's states once it has ended.
ENDED = frozenset({"COMPLETED", "FAILED", "HALTED"})


@dataclass
class Row:
    """One measured value, as `benchmarks/run.py --json` writes it."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def emit(self) -> Row:
        print(json.dumps(asdict(self)), flush=True)
        return self


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), nearest-rank, of at least one value."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def zip_code(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    return buf.getvalue()


def manifest(command: str, nodes: int = 1, **framework: Any) -> str:
    return yaml.safe_dump(
        {
            "name": "bench",
            "framework": {"name": "tensorflow", "version": "2.21", "command": command, **framework},
            "compute_configuration": {"name": "P100", "nodes": nodes},
        }
    )


@dataclass
class Platform:
    url: str
    home: Path
    headers: dict[str, str]
    process: subprocess.Popen[bytes]

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, **kwargs)

    def submit(self, http: httpx.Client, manifest_text: str, code: bytes) -> dict[str, Any]:
        r = http.post(
            "/v1/trainings",
            files={"manifest": ("m.yaml", manifest_text), "model_definition": ("c.zip", code)},
        )
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def wait(
        self,
        http: httpx.Client,
        training_id: str,
        done: Collection[str],
        timeout: float = 300,
        poll: float = 0.01,
    ) -> dict[str, Any]:
        """The training once in one of `done`, read every `poll` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t: dict[str, Any] = http.get(f"/v1/trainings/{training_id}").json()
            if t["status"] in done:
                return t
            time.sleep(poll)
        raise TimeoutError(f"{training_id} did not reach {done}")

    def run_to_end(
        self, http: httpx.Client, manifest_text: str, code: bytes, timeout: float = 600
    ) -> tuple[float, float | None, dict[str, Any]]:
        """Submit a training and wait for it to end: (seconds from just before the POST to
        the platform's own record of its last state, of them those before it recorded
        RUNNING (None if it never did), the training). The end is the time the platform
        recorded (status_history), read after it ended: polled four times a second, so
        that the client's requests do not take the cores from the learners it measures (at
        every 20 ms they slowed a 2-learner job by a few percent on 2 cores) nor add up to
        a poll's interval to what is measured."""
        submitted = time.time()
        t = self.submit(http, manifest_text, code)
        done = self.wait(http, t["id"], ENDED, timeout=timeout, poll=0.25)
        history = [
            (e["status"], datetime.fromisoformat(e["at"]).timestamp() - submitted)
            for e in done["status_history"]
        ]
        to_running = next((at for status, at in history if status == "RUNNING"), None)
        return history[-1][1], to_running, done


@contextmanager
def dlaas_up(**settings: str) -> Iterator[Platform]:
    """A `dlaas up` subprocess on a temporary DLAAS_HOME, with a standard-plan tenant."""
    with tempfile.TemporaryDirectory(prefix="dlaas-bench-") as tmp:
        home = Path(tmp) / "home"
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
        env.update(DLAAS_HOME=str(home), DLAAS_ADMIN_API_KEY="bench-admin", **settings)
        log = open(Path(tmp) / "dlaas-up.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [str(BIN / "dlaas"), "up", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_answering(f"{url}/healthz", proc, Path(tmp) / "dlaas-up.log")
            yield Platform(url, home, create_tenant(url, "bench-admin"), proc)
        finally:
            stop_process(proc, signal.SIGINT, grace=60)  # Ctrl-C: dlaas up's own shutdown
            log.close()


def wait_answering(
    url: str, proc: subprocess.Popen[bytes], log: Path | None = None, timeout: float = 120
) -> None:
    """Until GET `url` answers 200; raises if the server `proc` exits (with the end of its
    `log`) or does not answer within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-3000:] if log is not None else ""
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


def stop_process(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 30
) -> None:
    """Send `sig` to the process group `proc` leads, SIGKILL it after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def create_tenant(url: str, admin_key: str) -> dict[str, str]:
    """A standard-plan tenant named bench; the headers that authenticate as it."""
    r = httpx.post(
        f"{url}/v1/tenants",
        json={"name": "bench", "plan": "standard"},
        headers={"Authorization": f"Bearer {admin_key}"},
    )
    r.raise_for_status()
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


@dataclass(frozen=True)
class CpuTime:
    """A process's CPU time so far (seconds in user and in kernel mode), and its command."""

    user: float
    system: float
    command: str


def cpu_times(proc: Path = Path("/proc")) -> dict[int, CpuTime]:
    """Every process's CPU time so far, by pid, read from `proc` (Linux's /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The fields after the command's closing parenthesis: utime and stime are the
            # 14th and 15th of the whole line, the 12th and 13th of these.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # ended meanwhile
        found[int(entry.name)] = CpuTime(
            int(fields[11]) / tick, int(fields[12]) / tick, command.strip()
        )
    return found


def cpu_report(
    before: dict[int, CpuTime], after: dict[int, CpuTime], seconds: float, least: float = 0.02
) -> list[str]:
    """One line per process that used at least `least` of a core between the two readings:
    its share of a core (of it in the kernel), pid and command, busiest first."""
    used = []
    for pid, end in after.items():
        start = before.get(pid, CpuTime(0.0, 0.0, ""))
        user, system = end.user - start.user, end.system - start.system
        if (user + system) / seconds >= least:
            used.append((user + system, system, pid, end.command))
    return [
        f"{total / seconds:6.1%} of a core ({system / seconds:.1%} in the kernel)  "
        f"{pid} {command[:100]}"
        for total, system, pid, command in sorted(used, reverse=True)
    ]


@dataclass(frozen=True)
class MachineCpu:
    """The machine's CPU time so far, in clock ticks summed over its CPUs (/proc/stat's
    first line): all of it, and what the hypervisor gave to others while this guest
    wanted to run (steal)."""

    total: int
    stolen: int


def machine_cpu(stat: Path = Path("/proc/stat")) -> MachineCpu | None:
    """MachineCpu now, or None where /proc/stat cannot be read or its first line is not
    the CPUs' with a steal field."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal [guest guest_nice]: guest time
    # is counted in user already.
    if len(first) < 9 or first[0] != "cpu" or not all(v.isdigit() for v in first[1:9]):
        return None
    ticks = [int(v) for v in first[1:9]]
    return MachineCpu(total=sum(ticks), stolen=ticks[7])


def steal_share(before: MachineCpu | None, after: MachineCpu | None) -> float | None:
    """The share of the machine's CPU time between two readings that the hypervisor took
    (0.12: 12% of every CPU's time ran other guests), or None without both readings."""
    if before is None or after is None or after.total <= before.total:
        return None
    return round((after.stolen - before.stolen) / (after.total - before.total), 3)


@contextmanager
def steal_into(shares: list[float | None]) -> Iterator[None]:
    """Append to `shares` the steal_share of the machine over the block."""
    before = machine_cpu()
    yield
    shares.append(steal_share(before, machine_cpu()))


@contextmanager
def profiled(pid: int, name: str) -> Iterator[None]:
    """Sample process `pid` and its children with py-spy while the block runs, if
    BENCH_PROFILE_DIR names a folder: collapsed stacks in `<dir>/<name>.txt` (summarise
    them with `python benchmarks/profile_summary.py`). Otherwise nothing is sampled: the
    sampling takes CPU, so a profiled run's ratios are not the row's.

    With BENCH_CPU=1 (and no BENCH_PROFILE_DIR) each process's share of a core over the
    block is printed to standard error instead (`cpu_report`): which of the server, the
    model process, the load generator and the rest held the cores, without sampling."""
    folder = os.environ.get("BENCH_PROFILE_DIR")
    if not folder and os.environ.get("BENCH_CPU"):
        before, started = cpu_times(), time.perf_counter()
        yield
        after, seconds = cpu_times(), time.perf_counter() - started
        print(f"CPU during {name} ({seconds:.1f} s):", file=sys.stderr)
        for line in cpu_report(before, after, seconds):
            print(f"  {line}", file=sys.stderr)
        return
    if not folder:
        yield
        return
    out = Path(folder) / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    # --gil: what holds the interpreter (CPU); BENCH_PROFILE_FLAGS=--idle: wall time.
    flags = os.environ.get("BENCH_PROFILE_FLAGS", "--gil").split()
    command = [str(BIN / "py-spy"), "record", "--pid", str(pid), "--subprocesses"]
    command += ["--format", "raw", "--rate", "250", "--nonblocking", *flags, "-o", str(out)]
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # py-spy attaches before the measured work starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
