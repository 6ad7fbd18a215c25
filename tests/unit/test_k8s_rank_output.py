"""The shell steps of an MPI training's pods, run by sh here: a rank on an MPI host writes
its output to RANK_OUTPUT, which the host's learner container relays as its own output
(the agent sends it to that learner's log); a rank on the launcher leaves its output to
mpirun. Through mpirun alone, the launcher's log showed each line every rank printed (each
TensorFlow start-up notice) once per rank."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

from worker.backends.kubernetes import layout

RANK_LINES = "echo 'I tensorflow/core/platform/cpu_feature_guard.cc] notice'; echo oops >&2"


def here(text: str, tmp_path: Path) -> str:
    """`text` with the pod's paths moved under tmp_path."""
    text = text.replace(layout.RANK_OUTPUT, str(tmp_path / "rank-output"))
    return text.replace(layout.WORK_DIR, str(tmp_path / "work"))


def run_rank(tmp_path: Path, learner: int) -> subprocess.CompletedProcess[str]:
    """The rank prefix of learner `learner`'s pod (its host name ends in -<learner>)."""
    (tmp_path / "work" / "model-code").mkdir(parents=True, exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "hostname").write_text(f"#!/bin/sh\necho learner-abc123def456-{learner}\n")
    (bin_dir / "hostname").chmod(0o755)
    sh, dash_c, script, name = layout.mpi_setup().rank_prefix
    return subprocess.run(
        [sh, dash_c, here(script, tmp_path), name, "/bin/sh", "-c", RANK_LINES],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


def test_a_rank_on_a_host_writes_to_the_hosts_relay(tmp_path: Path) -> None:
    ran = run_rank(tmp_path, 2)
    assert ran.stdout == ran.stderr == ""
    assert (tmp_path / "rank-output").read_text().splitlines() == [
        "I tensorflow/core/platform/cpu_feature_guard.cc] notice",
        "oops",
    ]


def test_a_rank_on_the_launcher_leaves_its_output_to_mpirun(tmp_path: Path) -> None:
    ran = run_rank(tmp_path, 1)
    assert ran.stdout == "I tensorflow/core/platform/cpu_feature_guard.cc] notice\n"
    assert ran.stderr == "oops\n"
    assert not (tmp_path / "rank-output").exists()


def test_the_host_relays_its_ranks_output_as_its_own(tmp_path: Path) -> None:
    argv = layout.mpi_host_argv()
    assert argv[4:6] == ("/usr/sbin/sshd", "-D")
    # sshd's place taken by a process that outlives the test's reads, as sshd does.
    host = subprocess.Popen(
        [*argv[:2], here(argv[2], tmp_path), argv[3], "sleep", "30"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "rank-output").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run_rank(tmp_path, 2)
        assert host.stdout is not None
        relayed = b""
        while relayed.count(b"\n") < 2:
            ready, _, _ = select.select(
                [host.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            assert ready, f"relayed so far: {relayed!r}"
            relayed += os.read(host.stdout.fileno(), 4096)
        assert relayed.decode().splitlines() == [
            "I tensorflow/core/platform/cpu_feature_guard.cc] notice",
            "oops",
        ]
    finally:
        os.killpg(host.pid, signal.SIGKILL)
        host.wait()
