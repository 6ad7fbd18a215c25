"""The suite's leftover check (tests/leftovers.py), on a pytest run of its own: a test that
leaves a process running fails the run, which names the process and the test; a run that
stops what it starts passes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_pytest(directory: Path, test_source: str) -> subprocess.CompletedProcess[str]:
    (directory / "test_inner.py").write_text(textwrap.dedent(test_source))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DLAAS_LEFTOVER_GRACE": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.leftovers",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            str(directory),
        ],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_process_left_running_fails_the_run_and_is_named(tmp_path: Path) -> None:
    # As the learner network holders did: detached (setsid -f: its parent is init), with a
    # learner network's mark in its environment.
    run = run_pytest(
        tmp_path,
        """
        import os, pathlib, subprocess

        def test_leaves_a_holder(tmp_path):
            env = {**os.environ, "DLAAS_LEARNER_NETWORK": "/somewhere/net"}
            subprocess.run(["setsid", "-f", "sleep", "3011"], env=env, check=True)

        def test_leaves_a_child(tmp_path):
            proc = subprocess.Popen(["sleep", "3012"], start_new_session=True)
            pathlib.Path(os.environ["LEFT_PID_FILE"]).write_text(str(proc.pid))
        """.replace('os.environ["LEFT_PID_FILE"]', repr(str(tmp_path / "pid"))),
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "2 passed" in output
    assert "2 process(es) the tests started are still running" in output
    (holder,) = [line for line in output.splitlines() if "sleep 3011" in line]
    assert "[learner network namespace of /somewhere/net]" in holder
    assert "left by test_inner.py::test_leaves_a_holder" in holder
    (child,) = [line for line in output.splitlines() if "sleep 3012" in line]
    pid = int((tmp_path / "pid").read_text())
    assert f"pid {pid} " in child and "left by test_inner.py::test_leaves_a_child" in child
    assert not alive(pid)  # named, then killed: the machine is clean all the same


def test_a_run_that_stops_what_it_starts_passes(tmp_path: Path) -> None:
    run = run_pytest(
        tmp_path,
        """
        import subprocess

        def test_stops_its_process():
            proc = subprocess.Popen(["sleep", "3013"])
            proc.kill()
            proc.wait()
        """,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "still running" not in run.stdout


def test_the_sessions_own_resource_tracker_is_no_leftover(tmp_path: Path) -> None:
    # A test that uses a multiprocessing primitive starts multiprocessing's resource
    # tracker as a child of the pytest process; it exits when that process does.
    run = run_pytest(
        tmp_path,
        """
        from multiprocessing import resource_tracker

        def test_starts_the_tracker():
            resource_tracker.ensure_running()
            assert resource_tracker._resource_tracker._pid is not None
        """,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "processes left behind" not in output
