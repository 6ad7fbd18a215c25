"""Attack: modules named like the platform's in a tenant's directories.

A code archive (MODEL_DIR), the learner's HOME (user site-packages, `.pth` files,
`usercustomize`) and the environment (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME) are the
tenant's. Every Python the platform starts near them (the learner wrapper, the MPI ranks'
prefix, the MPI agent, a learner pod's steps, the model process) must import none of it:
such a module would run as the platform's user, outside the sandbox. Each entry point is
started here exactly as the platform builds its command, from a working directory, HOME
and environment full of such modules, each of which leaves a marker file when imported.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from service import sandbox
from service.scoring import process
from tests.integration.platform_harness import (
    EXAMPLES,
    ROOT,
    LivePlatform,
    ensure_runtime,
    live_platform,
)
from worker.backends import local
from worker.backends.kubernetes import layout
from worker.backends.local import LocalBackend
from worker.backends.netns import LearnerNetwork

pytestmark = pytest.mark.integration

# Top-level names a tenant may shadow: the platform's packages, and what Python imports
# by itself at start-up.
PACKAGES = ("worker", "service", "composition", "dlaas")
STARTUP_MODULES = ("sitecustomize", "usercustomize")
# The modules the entry points run, each as its own file in the shadowing packages.
ENTRY_MODULES = (
    "worker/__main__.py",
    "worker/learner/__init__.py",
    "worker/learner/__main__.py",
    "worker/learner/rank.py",
    "worker/learner/pod.py",
    "worker/backends/__init__.py",
    "worker/backends/netns.py",
    "worker/backends/netns_agent.py",
    "service/sandbox/__init__.py",
    "service/sandbox/limits.py",
    "service/scoring/__init__.py",
)
USER_SITE = f".local/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def _module_name(relative: str) -> str:
    return relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _marker_code(markers: Path, name: str) -> str:
    return f"import pathlib; pathlib.Path({str(markers)!r}, {name!r}).write_text('imported')\n"


def plant(tenant: Path, home: Path, markers: Path) -> None:
    """Fill `tenant` (a MODEL_DIR, the working directory, PYTHONPATH) and `home` (HOME)
    with modules that leave a marker in `markers` when imported."""
    for package in PACKAGES:
        (tenant / package).mkdir(parents=True, exist_ok=True)
        (tenant / package / "__init__.py").write_text(_marker_code(markers, package))
    for relative in ENTRY_MODULES:
        path = tenant / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(_marker_code(markers, _module_name(relative)))
    for name in STARTUP_MODULES:
        (tenant / f"{name}.py").write_text(_marker_code(markers, f"cwd-{name}"))
    site = home / USER_SITE
    site.mkdir(parents=True, exist_ok=True)
    for name in STARTUP_MODULES:
        (site / f"{name}.py").write_text(_marker_code(markers, f"user-site-{name}"))
    (site / "dlaas-shadow.pth").write_text(_marker_code(markers, "user-site-pth"))
    (tenant / "startup.py").write_text(_marker_code(markers, "pythonstartup"))
    # A PYTHONHOME of the tenant's: an interpreter that honoured it would not even start.
    (tenant / "pythonhome" / "lib").mkdir(parents=True, exist_ok=True)


@dataclass
class Place:
    """What a tenant controls around a platform process."""

    tenant: Path
    home: Path
    markers: Path
    platform: Path
    # Also PYTHONHOME: an interpreter that honours it fails to start before any import.
    pythonhome: bool = False

    def env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.home),
            "MODEL_DIR": str(self.tenant),
            "PYTHONPATH": str(self.tenant),
            "PYTHONSTARTUP": str(self.tenant / "startup.py"),
            "PYTHONHOME": str(self.tenant / "pythonhome"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if not self.pythonhome:
            del env["PYTHONHOME"]
        return env

    def markers_left(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())


@pytest.fixture
def place(tmp_path: Path) -> Place:
    p = Place(tmp_path / "model", tmp_path / "home", tmp_path / "markers", tmp_path / "platform")
    for d in (p.tenant, p.home, p.markers, p.platform):
        d.mkdir()
    plant(p.tenant, p.home, p.markers)
    return p


def _run(argv: list[str], place: Place, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`argv` started in the tenant's place; no module of the tenant's was imported (the
    entry point then checks that it did its own work)."""
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        argv,
        cwd=place.tenant,
        env=place.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,
    )
    assert place.markers_left() == [], (argv, done.stderr[-2000:])
    return done


def _python(argv: list[str]) -> list[str]:
    """A pod's command as this machine runs it: the image's `python` is this one."""
    return [sys.executable, *argv[1:]] if argv[0] == "python" else argv


def wrapper(place: Place) -> subprocess.CompletedProcess[str]:
    """The learner wrapper as LocalBackend._spawn starts it, given a spec that does not
    exist."""
    spawned: list[list[str]] = []
    original = local.subprocess.run
    local.subprocess.run = lambda argv, **_: spawned.append(argv)  # type: ignore[assignment]
    try:
        LocalBackend._spawn(place.platform / "spec.json")
    finally:
        local.subprocess.run = original
    (argv,) = spawned
    assert argv[:2] == ["setsid", "-f"]
    done = _run(argv[2:], place)
    assert "cannot read the learner spec" in done.stderr, done.stderr
    return done


def _rank_prefix(place: Place, *, relayed: bool) -> subprocess.CompletedProcess[str]:
    """An MPI rank's prefix (worker.backends.local_mpi's MpiSetup): it must still become
    the tenant's command, in MODEL_DIR."""
    from worker.backends import local_mpi

    setup = local_mpi.mpi_setup(place.platform, None, None, relayed=relayed)
    learner = {"env": {"MODEL_DIR": str(place.tenant)}, "prefix": [], "limits": {}}
    ranks = {"hosts": {socket.gethostname(): learner}, "by_rank": {}}
    (place.platform / "ranks.json").write_text(json.dumps(ranks))
    command = ["/bin/sh", "-c", 'echo "tenant command in $PWD"']
    done = _run([*setup.rank_prefix, *command], place)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"tenant command in {place.tenant}"
    return done


def rank_prefix(place: Place) -> subprocess.CompletedProcess[str]:
    """The prefix as the platform's module, where mpirun runs outside the sandbox."""
    return _rank_prefix(place, relayed=False)


def sandboxed_rank_prefix(place: Place) -> subprocess.CompletedProcess[str]:
    """The prefix as a file run by the runtime's Python, inside the learner's sandbox."""
    return _rank_prefix(place, relayed=True)


def relay_client(place: Place) -> subprocess.CompletedProcess[str]:
    """mpirun's agent inside the sandbox (the relay's client), with no relay to reach."""
    from worker.backends import local_mpi

    agent = place.platform / "mpi-agent"
    agent.write_text(local_mpi.agent_script(sys.executable, place.platform))
    agent.chmod(0o755)
    done = _run([str(agent), "-x", "learner-x-2", "true"], place)
    assert done.returncode == 255 and "cannot be reached" in done.stderr, done.stderr
    return done


def mpi_agent(place: Place) -> subprocess.CompletedProcess[str]:
    """The MPI agent mpirun calls (a LearnerNetwork's mpi-agent), for a learner that is
    not in its network (the network itself is never created here)."""
    net = LearnerNetwork("t", ["learner-x-1"], place.platform / "net")
    net.state_dir.mkdir()
    net._write_files()
    done = _run([str(net.agent), "learner-x-2", "true"], place)
    assert done.returncode == 255 and "no learner 'learner-x-2'" in done.stderr, done.stderr
    return done


def pod_fetch(place: Place) -> subprocess.CompletedProcess[str]:
    done = _run(_python(layout.fetch_command(1)), place)
    assert "cannot be read" in done.stderr, done.stderr
    return done


def pod_agent(place: Place) -> subprocess.CompletedProcess[str]:
    done = _run(_python(layout.agent_command(1)), place)
    assert "cannot be read" in done.stderr, done.stderr
    return done


def pod_run(place: Place) -> subprocess.CompletedProcess[str]:
    """The learner container's step, refusing a malformed endpoint before it waits."""
    done = _run(_python(layout.run_command(["true"], wait_for=("no-port",))), place)
    assert done.returncode == 2 and "worker.learner.pod run" in done.stderr, done.stderr
    return done


def model_process(place: Place) -> subprocess.CompletedProcess[str]:
    """The model process as it runs where no sandbox can be made (there the tenant's files
    would be in reach): its control socket closed before any request, it ends with 0."""
    ours, theirs = socket.socketpair()
    config = process.ProcessConfig(connections=1, call_timeout=5, allow_unsandboxed=True)
    unsandboxed = sandbox.SandboxSupport(None, "disabled for this test")
    original = sandbox.probe
    sandbox.probe = lambda: unsandboxed  # type: ignore[assignment]
    try:
        argv, sandboxed = process.command(place.tenant, [theirs.fileno()], config)
    finally:
        sandbox.probe = original
    assert not sandboxed
    ours.close()
    try:
        done = _run(argv, place, pass_fds=(theirs.fileno(),))
    finally:
        theirs.close()
    assert done.returncode == 0, done.stderr
    return done


ENTRY_POINTS: dict[str, Callable[[Place], subprocess.CompletedProcess[str]]] = {
    "learner wrapper": wrapper,
    "MPI rank prefix": rank_prefix,
    "MPI rank prefix in the sandbox": sandboxed_rank_prefix,
    "MPI agent": mpi_agent,
    "MPI agent in the sandbox (relay client)": relay_client,
    "pod fetch step": pod_fetch,
    "pod agent step": pod_agent,
    "pod run step": pod_run,
    "model process": model_process,
}


@pytest.mark.parametrize("pythonhome", [False, True], ids=["modules", "modules+PYTHONHOME"])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_no_tenant_module_is_imported(entry: str, pythonhome: bool, place: Place) -> None:
    place.pythonhome = pythonhome
    ENTRY_POINTS[entry](place)
    assert place.markers_left() == []


def _plain(place: Place, argv: list[str]) -> list[str]:
    env = place.env()
    done = subprocess.run(
        argv, cwd=place.tenant, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return place.markers_left()


def test_the_planted_modules_are_imported_by_a_plain_python(place: Place) -> None:
    """The check can fail: a Python started as the platform started them before (`-m`
    from MODEL_DIR, the environment honoured) imports the tenant's modules."""
    left = _plain(place, [sys.executable, "-m", "worker.learner.rank"])
    assert {"worker", "worker.learner", "worker.learner.rank", "cwd-sitecustomize"} <= set(left)


BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}"


@pytest.mark.skipif(not BASE_PYTHON.exists(), reason="no base interpreter outside the venv")
def test_the_user_site_is_a_route_that_isolation_closes(place: Place) -> None:
    """A venv ignores the user site directory; an interpreter outside one reads it (the
    tenant's HOME): its `.pth` file and usercustomize run, unless it starts with -I."""
    assert _plain(place, [str(BASE_PYTHON), "-I", "-c", "pass"]) == []
    left = _plain(place, [str(BASE_PYTHON), "-c", "pass"])
    # usercustomize: the user site's, or PYTHONPATH's (first on the path) in its stead.
    assert "user-site-pth" in left and any(n.endswith("-usercustomize") for n in left)


# -- end to end: real MPI trainings whose code archive shadows the platform -------------------

# What each shadowing module of the archive does where it is imported: read every file of
# DLAAS_HOME it can (its secret key, client.json, the database), and where it read any,
# say so on its output, leave a marker outside the learner's directories and copy the
# list into RESULT_DIR for its owner to download. In the sandbox it can read none.
_ATTACK = """
import os, pathlib, sys
found = []
for root, _dirs, files in os.walk({home!r}):
    for name in files:
        path = os.path.join(root, name)
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError:
            continue
        found.append(path)
if found:
    print("shadow {name} read " + " ".join(found), flush=True)
    try:
        os.makedirs({markers!r}, exist_ok=True)
        pathlib.Path({markers!r}, {name!r}).write_text("\\n".join(found))
        pathlib.Path(os.environ.get("RESULT_DIR", "."), "leaked-{name}.txt").write_text(
            "\\n".join(found)
        )
    except OSError:
        pass
"""
_SHADOWS = (
    "worker/__init__.py",
    "worker/__main__.py",
    "worker/learner/__init__.py",
    "worker/learner/__main__.py",
    "worker/learner/rank.py",
    "worker/backends/__init__.py",
    "worker/backends/netns_agent.py",
    "service/__init__.py",
    "service/sandbox/__init__.py",
    "composition/__init__.py",
    "dlaas/__init__.py",
    "sitecustomize.py",
    "usercustomize.py",
)
MPI_TRAININGS = {
    "tensorflow-horovod": ("03-tensorflow-horovod.yaml", "horovod-tf2"),
    "tensorflow-ddl": ("04-tensorflow-ddl.yaml", "ddl-mnist-style"),
}


def shadowing_archive(example: Path, home: Path, markers: Path) -> bytes:
    """The example's code, plus modules named like the platform's that attack it."""
    files = {p.relative_to(example).as_posix(): p.read_bytes() for p in example.rglob("*.py")}
    for relative in _SHADOWS:
        attack = _ATTACK.format(home=str(home), markers=str(markers), name=_module_name(relative))
        files[relative] = attack.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in sorted(files.items()):
            z.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def mpi_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    ensure_runtime("horovod-tf2.14")
    ensure_runtime("ddl-tf2.14")
    root = tmp_path_factory.mktemp("shadow")
    with live_platform(root / "home", f"sqlite:///{root / 'dlaas.db'}") as p:
        yield p


@pytest.mark.parametrize("framework", sorted(MPI_TRAININGS))
def test_an_mpi_training_shadowing_the_platform_runs_only_the_tenants_command(
    framework: str, mpi_platform: LivePlatform, tmp_path: Path
) -> None:
    manifest_name, example = MPI_TRAININGS[framework]
    manifest = yaml.safe_load((ROOT / "manifests" / manifest_name).read_text())
    assert manifest["framework"]["name"] == framework
    home = mpi_platform.settings.home_dir
    markers = tmp_path / "markers"
    archive = shadowing_archive(EXAMPLES / example, home, markers)
    t = mpi_platform.submit(manifest, archive)
    done = mpi_platform.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    logs = mpi_platform.logs(t["id"])
    results = mpi_platform.results(t["id"])
    # No shadowing module ran outside the sandbox: none read DLAAS_HOME (printed,
    # stored as a result) nor wrote outside the learner's directories.
    assert not markers.exists(), sorted(p.name for p in markers.iterdir())
    assert "shadow " not in logs and str(home) not in logs, logs[-3000:]
    assert not [name for name in results if name.startswith("leaked-")], sorted(results)
    # And the tenant's own command ran, on both learners, to its end.
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    assert re.search(r"rank=0 size=2 ", logs) and re.search(r"rank=1 size=2 ", logs), logs
    checksums = dict(re.findall(r"rank=(\d) checksum=(-?[0-9.]+)", logs))
    assert set(checksums) == {"0", "1"} and checksums["0"] == checksums["1"], logs[-3000:]
