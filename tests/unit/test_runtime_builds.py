"""`dlaas up` and the framework runtimes: installed on their first use unless the operator
says otherwise, and with --install-runtimes built in the background from start-up, the
builds stopped with `dlaas up` (composition.runtime_builds)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import composition
from composition.runtime_builds import RuntimeBuilds, embedded_defaults
from dlaas.cli import app


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, {"DLAAS_RUNTIME_AUTO_INSTALL": "true"}),
        ({"DLAAS_RUNTIME_AUTO_INSTALL": "false"}, {}),  # the operator's choice stands
        ({"DLAAS_RUNTIME_AUTO_INSTALL": "true"}, {}),
    ],
)
def test_dlaas_up_installs_runtimes_on_first_use_by_default(
    environ: dict[str, str], expected: dict[str, str]
) -> None:
    assert embedded_defaults(environ) == expected


@pytest.mark.parametrize(("args", "expected"), [([], False), (["--install-runtimes"], True)])
def test_install_runtimes_is_passed_to_serve(
    monkeypatch: pytest.MonkeyPatch, args: list[str], expected: bool
) -> None:
    seen: dict[str, Any] = {}

    def serve(host: str, port: int, **kwargs: Any) -> None:
        seen.update(kwargs, host=host, port=port)

    monkeypatch.setattr(composition, "serve", serve)
    result = CliRunner().invoke(app, ["up", "--port", "8181", *args])
    assert result.exit_code == 0, result.output
    assert seen["install_runtimes"] is expected and seen["port"] == 8181


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_the_builds_run_in_the_background_and_stop_with_dlaas_up(tmp_path: Path) -> None:
    said: list[str] = []
    pids = tmp_path / "pids"
    # A build that starts a compiler-like grandchild and runs for a long time.
    script = f"sleep 60 & echo $! > {pids}; echo building; wait"
    builds = RuntimeBuilds(tmp_path / "runtimes-install.log", said.append, ["sh", "-c", script])
    builds.start()
    assert builds.proc is not None
    deadline = time.monotonic() + 10
    while not pids.exists() or not pids.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pids.read_text())
    builds.check()
    assert builds.returncode is None  # still building
    assert any("building every runtime in the background" in line for line in said)
    builds.stop(timeout=5)
    assert builds.proc.poll() is not None
    deadline = time.monotonic() + 5
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the build's own children outlived it"
        time.sleep(0.05)
    assert "building" in (tmp_path / "runtimes-install.log").read_text()


@pytest.mark.parametrize(("code", "said"), [(0, "every runtime is installed"), (3, "failed")])
def test_the_end_of_the_builds_is_said_once(tmp_path: Path, code: int, said: str) -> None:
    lines: list[str] = []
    builds = RuntimeBuilds(tmp_path / "log", lines.append, [sys.executable, "-c", f"exit({code})"])
    builds.start()
    assert builds.proc is not None
    builds.proc.wait(timeout=30)
    builds.check()
    builds.check()
    assert builds.returncode == code
    assert [line for line in lines if said in line] == [lines[-1]]
    builds.stop()
