"""`dlaas tensorboard`'s TensorBoard process: stopped with everything it started (its data
server), and Ctrl-C or SIGTERM honoured whatever the command inherited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from dlaas.tensorboard import start_tensorboard, stop_tensorboard

ROOT = Path(__file__).resolve().parents[2]

# A TensorBoard stand-in: starts a "data server" (which ignores SIGTERM, as a slow one
# would not stop in time), writes its pid, serves nothing.
FAKE_TENSORBOARD = """#!{python}
import pathlib, subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
pathlib.Path({pid_file!r}).write_text(str(server.pid))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_for(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    return path.read_text()


def test_stopping_tensorboard_stops_its_data_server_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    fake = tmp_path / "tensorboard"
    fake.write_text(FAKE_TENSORBOARD.format(python=sys.executable, pid_file=str(pid_file)))
    fake.chmod(0o755)
    proc = start_tensorboard(tmp_path / "logs", 1, executable=fake)
    server = int(wait_for(pid_file))
    assert os.getpgid(server) == proc.pid  # TensorBoard leads a group of its own
    started = time.monotonic()
    stop_tensorboard(proc, grace=1)
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 5
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(server)
    assert time.monotonic() - started < 5


INTERRUPTIBLE = textwrap.dedent("""
    import time
    from dlaas.tensorboard import interruptible
    with interruptible():
        try:
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("stopping what it started", flush=True)
""")


def test_ctrl_c_and_sigterm_stop_it_even_where_sigint_was_inherited_ignored() -> None:
    """As `bash script &` starts a command: SIGINT ignored (Python then never raises
    KeyboardInterrupt for it, and Ctrl-C did nothing)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen(
            [sys.executable, "-c", INTERRUPTIBLE],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=10)
            assert proc.returncode == 0, sig
            assert out == "stopping what it started\n"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
