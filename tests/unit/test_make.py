"""The Makefile and the package metadata as a new user meets them: a second `make install`
(or `make test`, `make run`) reinstalls nothing while pyproject.toml is unchanged, `make
run` is the command the README shows, and building the metadata prints no packaging
warning."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
# The scoring gRPC API's messages, installed without the `tensorflow` they require.
SERVING_API = "install --quiet --no-deps tensorflow-serving-api==2.21.*"
needs_make = pytest.mark.skipif(MAKE is None, reason="no make on this machine")


def copy_inputs(to: Path) -> None:
    """What the Makefile's targets are made from."""
    for name in ("Makefile", "pyproject.toml", "package.json", "package-lock.json"):
        shutil.copy(ROOT / name, to / name)
    shutil.copytree(ROOT / "native", to / "native")


def make(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert MAKE is not None
    return subprocess.run(
        [MAKE, "--no-print-directory", *args],
        cwd=cwd,
        env={**os.environ, "CHROMIUM": str(cwd / "chromium")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile and pyproject.toml beside a virtualenv whose pip only records its
    arguments (one line per call): the Makefile's own logic, nothing installed."""
    copy_inputs(tmp_path)
    # The front-end libraries installed and the browser there (their own targets).
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / ".installed").write_text("")
    (tmp_path / "chromium").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").write_text("")
    pip = bin_dir / "pip"
    pip.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "pip-calls"}\n')
    pip.chmod(pip.stat().st_mode | stat.S_IXUSR)
    # The gRPC front's build script: it only records its calls.
    build = tmp_path / "native" / "grpc_front" / "build"
    build.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "build-calls"}\ntouch "$1"\n')
    build.chmod(build.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def pip_calls(checkout: Path) -> list[str]:
    calls = checkout / "pip-calls"
    return calls.read_text().splitlines() if calls.exists() else []


@needs_make
def test_a_second_install_does_nothing_until_pyproject_changes(checkout: Path) -> None:
    first = make(checkout, "install")
    assert first.returncode == 0, first.stderr
    assert pip_calls(checkout) == ["install --quiet -e .[dev,mpi,tensorflow,onnx]", SERVING_API]
    assert (checkout / "build-calls").read_text() == ".venv/bin/dlaas-grpc-front\n"

    second = make(checkout, "install")
    assert second.returncode == 0, second.stderr
    assert "pip" not in second.stdout and len(pip_calls(checkout)) == 2
    assert (checkout / "build-calls").read_text().count("\n") == 1  # not built again
    assert make(checkout, "-q", "install").returncode == 0  # up to date
    dry = make(checkout, "-n", "run")
    assert "pip install" not in dry.stdout

    later = (checkout / "pyproject.toml").stat().st_mtime + 10
    os.utime(checkout / "pyproject.toml", (later, later))
    assert make(checkout, "-q", "install").returncode != 0  # out of date
    third = make(checkout, "install")
    assert third.returncode == 0, third.stderr
    assert len(pip_calls(checkout)) == 4


@needs_make
def test_other_extras_are_installed_once_each(checkout: Path) -> None:
    assert make(checkout, "install", "EXTRAS=dev").returncode == 0
    assert make(checkout, "install").returncode == 0
    assert make(checkout, "install", "EXTRAS=dev").returncode == 0
    assert pip_calls(checkout) == [
        "install --quiet -e .[dev]",
        SERVING_API,
        "install --quiet -e .[dev,mpi,tensorflow,onnx]",
        SERVING_API,
    ]


@needs_make
def test_make_run_is_what_the_readme_says(checkout: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    promised = re.search(r"^make run\s+# = (.+)$", readme, re.MULTILINE)
    assert promised, "the README shows what `make run` runs"
    assert make(checkout, "install").returncode == 0
    dry = make(checkout, "-n", "run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [promised.group(1).strip()]


def test_the_readme_download_folder_is_ignored() -> None:
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^dlaas download <id> results/ ", readme, re.MULTILINE)
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "results/" in ignored


def build(tmp_path: Path, hook: str, *sources: str) -> tuple[str, Path]:
    """Runs a setuptools build hook as pip does, on a copy of `sources`; returns what it
    printed (warnings included, each once) and where the hook's result is."""
    pytest.importorskip("setuptools", minversion="77")
    for name in ("pyproject.toml", "README.md", *sources):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tmp_path / name)
    (tmp_path / "out").mkdir()
    built = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            "-c",
            f"from setuptools import build_meta; print(build_meta.{hook}('out'))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    return output, tmp_path / "out" / built.stdout.splitlines()[-1]


def test_the_package_metadata_builds_without_a_warning(tmp_path: Path) -> None:
    """What pip asks first (the metadata): a license as a TOML table is deprecated there."""
    output, dist_info = build(tmp_path, "prepare_metadata_for_build_wheel")
    assert "Warning" not in output and "deprecated" not in output.lower(), output
    metadata = (dist_info / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


def test_the_editable_install_builds_without_a_warning(tmp_path: Path) -> None:
    """What `make install` builds: setuptools warns (and pip prints it, --quiet or not)
    when it has to map top-level packages with an import hook."""
    output, wheel = build(tmp_path, "build_editable", "service", "worker", "dlaas", "composition")
    assert "Warning" not in output and "careful" not in output, output
    assert wheel.suffix == ".whl"


@needs_make
def test_quickstart_installs_nothing_outside_the_venv(tmp_path: Path) -> None:
    """On a fresh clone (no stamp, no .venv, no node_modules) of a machine without Chromium:
    `make quickstart` would run pip into .venv and the journey, and no apt-get, no npm."""
    copy_inputs(tmp_path)
    dry = make(tmp_path, "-n", "quickstart")  # CHROMIUM: a path that does not exist here
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / "chromium").exists()
    assert "apt-get" not in dry.stdout and "chromium" not in dry.stdout.lower(), dry.stdout
    assert "npm" not in dry.stdout
    assert "pip install --quiet -e" in dry.stdout and "examples/quickstart.py" in dry.stdout
    # Nor anywhere in what quickstart depends on, as make reads the Makefile.
    graph = make(tmp_path, "-pnq", "quickstart").stdout
    (rule,) = [line for line in graph.splitlines() if line.startswith("quickstart:")]
    assert "browser" not in rule and "install" not in rule.split(":", 1)[1].split()


@needs_make
def test_make_test_installs_the_browser_and_says_so_first(tmp_path: Path) -> None:
    copy_inputs(tmp_path)
    lines = make(tmp_path, "-n", "test").stdout.splitlines()
    install = lines.index("apt-get update && apt-get install -y chromium")
    assert "Installing Debian's Chromium" in lines[install - 1]
    assert lines[install - 1].startswith("echo ")
    assert ".ci/run" not in lines  # CI runs `make test` itself
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")
