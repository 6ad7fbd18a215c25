"""The installer on a small runtime: a real virtual environment built from pins, recorded
with what it provides, a no-op the second time, and nothing left of a failed build."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from service import runtimes
from tests.integration.platform_harness import ROOT

pytestmark = pytest.mark.integration


def define(tmp_path: Path, text: str) -> tuple[Path, Path]:
    definitions = tmp_path / "defs"
    definitions.mkdir(exist_ok=True)
    (definitions / "small.txt").write_text(text)
    return definitions, tmp_path / "runtimes"


def test_a_runtime_is_built_once_from_its_pins(tmp_path: Path) -> None:
    definitions, root = define(tmp_path, "# a small runtime\nsix==1.17.0\n")
    lines: list[str] = []
    info = runtimes.install("small", root, lines.append, definitions)
    digest = runtimes.requirements_hash((definitions / "small.txt").read_text())
    assert Path(info.prefix) == root / f"small-{digest}"
    marker = json.loads((Path(info.prefix) / "runtime.json").read_text())
    assert marker["requirements_hash"] == digest and marker["python"] == info.python
    assert info.provides["python"].startswith("3.11")
    assert "tensorflow" not in info.provides  # it provides only what it pins
    version = subprocess.run(
        [info.python, "-c", "import six; print(six.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "1.17.0"
    assert any("installed at" in line for line in lines)
    assert runtimes.installed(root, "small", definitions) == info

    again: list[str] = []
    assert runtimes.install("small", root, again.append, definitions) == info
    assert again == [f"small: already installed at {info.prefix}"]


def test_a_failed_build_leaves_nothing_installed(tmp_path: Path) -> None:
    definitions, root = define(tmp_path, "dlaas-no-such-package-anywhere==0.0.1\n")
    with pytest.raises(runtimes.RuntimeBuildError, match="exited"):
        runtimes.install("small", root, lambda _: None, definitions)
    assert runtimes.installed(root, "small", definitions) is None
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == []


def test_a_changed_definition_is_a_new_runtime(tmp_path: Path) -> None:
    definitions, root = define(tmp_path, "six==1.17.0\n")
    first = runtimes.install("small", root, lambda _: None, definitions)
    (definitions / "small.txt").write_text("six==1.16.0\n")
    assert runtimes.installed(root, "small", definitions) is None
    second = runtimes.install("small", root, lambda _: None, definitions)
    assert second.prefix != first.prefix


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlaas.cli", "runtimes", *args],
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "DLAAS_HOME": str(home),
        },
        timeout=120,
        check=False,
    )


def test_installing_an_unknown_runtime_fails_with_a_clear_error(tmp_path: Path) -> None:
    done = _cli("install", "nope", home=tmp_path)
    assert done.returncode == 1
    assert "unknown runtime 'nope'; known: platform, ddl-tf2.14, horovod-tf2.14" in done.stderr


def test_runtimes_list_on_a_fresh_home_shows_only_the_platform_installed(tmp_path: Path) -> None:
    done = _cli("list", "--json", home=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {r["name"]: r for r in json.loads(done.stdout)}
    assert listed["platform"]["installed"] is True
    assert {"framework": "tensorflow", "version": "1.5"} in listed["platform"]["serves"]
    assert listed["horovod-tf2.14"]["installed"] is False
    assert listed["horovod-tf2.14"]["provides"] == {}
    table = _cli("list", home=tmp_path)
    assert re.search(r"ddl-tf2\.14\s+tensorflow-ddl 1\.5.*\s+no\s", table.stdout), table.stdout
    assert re.search(r"horovod-tf2\.14\s+tensorflow-horovod 1\.5.*\s+no\s", table.stdout)


def test_two_installs_at_once_build_it_once(tmp_path: Path) -> None:
    definitions, root = define(tmp_path, "six==1.17.0\n")
    lines: dict[int, list[str]] = {0: [], 1: []}
    with ThreadPoolExecutor(2) as pool:
        infos = list(
            pool.map(
                lambda i: runtimes.install("small", root, lines[i].append, definitions), (0, 1)
            )
        )
    assert infos[0] == infos[1]
    built = [i for i in (0, 1) if any("creating the environment" in line for line in lines[i])]
    assert len(built) == 1  # the other waited on the lock, then found it installed
    (waited,) = {0, 1} - set(built)
    assert lines[waited] == [f"small: already installed at {infos[0].prefix}"]


def test_a_local_package_is_installed_from_a_copy_and_a_change_is_a_new_runtime(
    tmp_path: Path,
) -> None:
    # The runtime pins what builds the package (it is built without build isolation).
    pins = "setuptools==69.5.1\nwheel==0.43.0\nsix==1.17.0\n#! local pkgs/hello\n"
    definitions, root = define(tmp_path, pins)
    package = definitions / "pkgs" / "hello"
    (package / "hello").mkdir(parents=True)
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "hello"\nversion = "1.0"\n'
    )
    (package / "hello" / "__init__.py").write_text("WORD = 'one'\n")
    lines: list[str] = []
    first = runtimes.install("small", root, lines.append, definitions)
    assert any("installing the local package pkgs/hello" in line for line in lines)

    def word(info: runtimes.RuntimeInfo) -> str:
        return subprocess.run(
            [info.python, "-c", "import hello; print(hello.WORD, hello.__file__)"],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        ).stdout.strip()

    said, origin = word(first).split()
    assert said == "one" and origin.startswith(first.prefix)  # installed, not linked
    # The build left nothing in the package's source.
    assert sorted(p.name for p in package.rglob("*")) == ["__init__.py", "hello", "pyproject.toml"]
    # A changed source is a new runtime; the old one is no longer the installed one.
    (package / "hello" / "__init__.py").write_text("WORD = 'two'\n")
    assert runtimes.installed(root, "small", definitions) is None
    second = runtimes.install("small", root, lines.append, definitions)
    assert second.prefix != first.prefix
    assert word(second).split()[0] == "two"
