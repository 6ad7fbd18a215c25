"""The seccomp filter every sandboxed process runs under: what a tenant's command may not
ask the kernel for.

The filter allows by default and refuses, with EPERM, what a training or a model has no
use for and what would let it escalate: debugging other processes, new namespaces (and
with them new capabilities), mounts, the kernel's keyrings, BPF, performance counters,
userfaultfd, kernel modules, kexec, reboot, swap. `clone` is refused only when it asks for
a new namespace (its flags are compared, masked, one flag per rule); `clone3` passes its
flags in a structure a filter cannot read, so it is answered ENOSYS and the C library falls
back to `clone`. `ioctl` may not push characters into a terminal (TIOCSTI, TIOCLINUX), and
`personality` may only read the persona or set the default one.

`DENIED` and the argument rules below are the table; `build` turns them into libseccomp's
filter (the `pyseccomp` binding: libseccomp resolves each name for this machine's
architecture, and a call from another architecture's ABI, e.g. i386's int 0x80 on x86_64,
kills the process), `compile` into the BPF program that bwrap loads (`--seccomp FD`) after
setting `no_new_privs`. `install` writes it, once per content, into a directory of the
platform's own that no sandbox shows.

A second, small filter is a listening server's (`LISTENER_DENIED`, `build_listener`): the
scoring gRPC front loads it on top of the sandbox's once it listens, and from then on
opens no socket, connection or listener (`install(directory, listener=True)`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.private import private_dir


class FilterUnavailable(RuntimeError):
    """No seccomp filter can be made here (no libseccomp); str() says why."""


# Refused outright (EPERM), with why.
DENIED: dict[str, str] = {
    # Reading or changing another process's memory and registers.
    "ptrace": "debug another process",
    "process_vm_readv": "read another process's memory",
    "process_vm_writev": "write another process's memory",
    "kcmp": "compare another process's kernel objects",
    "pidfd_getfd": "take another process's file descriptors",
    # Mounts: the sandbox's view of the file system is bwrap's, fixed before the command.
    "mount": "mount a file system",
    "umount2": "unmount a file system",
    "pivot_root": "change the root file system",
    "chroot": "change the root directory",
    "move_mount": "move a mount",
    "open_tree": "clone a mount",
    "fsopen": "open a file system context",
    "fsmount": "mount a file system context",
    "fsconfig": "configure a file system context",
    "fspick": "reconfigure a mount",
    "mount_setattr": "change a mount's attributes",
    "open_by_handle_at": "open a file by handle, around the mounts",
    # Namespaces: a new user namespace gives back every capability inside it.
    "setns": "enter another namespace",
    "unshare": "make a new namespace",
    # The kernel's keyrings, BPF, performance counters, userfaultfd, io_uring: large
    # kernel surfaces a training does not use.
    "keyctl": "use the kernel's keyrings",
    "add_key": "add a key to a kernel keyring",
    "request_key": "request a key from a kernel keyring",
    "bpf": "load a BPF program",
    "perf_event_open": "open a performance counter",
    "userfaultfd": "handle page faults in user space",
    "io_uring_setup": "set up an io_uring",
    "io_uring_enter": "use an io_uring",
    "io_uring_register": "register with an io_uring",
    "fanotify_init": "watch the file system",
    # The machine itself.
    "init_module": "load a kernel module",
    "finit_module": "load a kernel module",
    "delete_module": "unload a kernel module",
    "kexec_load": "load a new kernel",
    "kexec_file_load": "load a new kernel",
    "reboot": "reboot the machine",
    "swapon": "add swap",
    "swapoff": "remove swap",
    "acct": "switch process accounting",
    "quotactl": "change disk quotas",
    "syslog": "read or clear the kernel's log",
    "iopl": "reach I/O ports",
    "ioperm": "reach I/O ports",
    "settimeofday": "set the clock",
    "clock_settime": "set a clock",
    "sethostname": "set the host name",
    "setdomainname": "set the domain name",
    "vhangup": "hang up the terminal",
    "uselib": "load a library the old way",
    "lookup_dcookie": "look up a directory entry cookie",
}

# Answered ENOSYS: the C library falls back to `clone`, whose flags the filter reads.
UNIMPLEMENTED: tuple[str, ...] = ("clone3",)

# `clone` with any of these flags is refused (EPERM). CLONE_NEWTIME is not one of
# them: `clone` cannot ask for it (that bit is the exit signal's), only `unshare`/`clone3`.
CLONE_NAMESPACE_FLAGS: dict[str, int] = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

# `ioctl` requests refused (EPERM): both push input into a terminal (another process's
# shell, where the sandbox shares one). The kernel reads the request as 32 bits: compared
# masked, so that higher bits set do not slip past.
DENIED_IOCTLS: dict[str, int] = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}

# `personality` may only be read (0xffffffff) or set to the default (PER_LINUX, 0).
PERSONALITY_QUERY = 0xFFFFFFFF
PERSONALITY_DEFAULT = 0

_MASK32 = 0xFFFFFFFF


def _seccomp() -> Any:
    """libseccomp's binding, or FilterUnavailable saying why there is none."""
    try:
        import pyseccomp
    except ImportError as e:
        raise FilterUnavailable(
            f"libseccomp's Python binding (pyseccomp) is not installed: {e}"
        ) from e
    except (OSError, RuntimeError) as e:  # the binding loads libseccomp.so.2 at import
        raise FilterUnavailable(f"libseccomp (libseccomp2) is not installed: {e}") from e
    return pyseccomp


@dataclass(frozen=True)
class ArgRule:
    """Refuse `syscall` when its argument `arg` masked by `mask` equals `value` (or, with
    `above` set, when the argument is greater than `value`)."""

    syscall: str
    arg: int
    mask: int
    value: int
    errno: int = errno.EPERM
    above: bool = False


def personality_rules() -> tuple[ArgRule, ...]:
    """`personality(p)` refused unless p (32 bits, as the kernel reads it) is 0 or
    0xffffffff, i.e. unless its bits are all equal: for each pair of neighbouring bits
    (the 32nd's neighbour is the 1st) one rule refuses them differing one way, one the
    other. libseccomp compares an argument once per rule, and rules are alternatives, so
    "not 0 and not 0xffffffff" is written as "some neighbours differ". A value with bits
    above the 32nd is refused too (the kernel would ignore them)."""
    rules = [ArgRule("personality", 0, 0, _MASK32, above=True)]
    for bit in range(32):
        low, high = 1 << bit, 1 << ((bit + 1) % 32)
        rules.append(ArgRule("personality", 0, low | high, low))
        rules.append(ArgRule("personality", 0, low | high, high))
    return tuple(rules)


def arg_rules() -> tuple[ArgRule, ...]:
    clone = tuple(ArgRule("clone", 0, flag, flag) for flag in CLONE_NAMESPACE_FLAGS.values())
    ioctl = tuple(ArgRule("ioctl", 1, _MASK32, request) for request in DENIED_IOCTLS.values())
    return (*clone, *ioctl, *personality_rules())


def _allowing(sc: Any) -> Any:
    """A filter that allows by default, for this machine's architecture. A call from
    another ABI than the machine's (i386's int 0x80, x32) kills the process: its numbers
    are another table's, which no rule here covers."""
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    return flt


def build() -> Any:
    """The filter (a `pyseccomp.SyscallFilter`), for this machine's architecture."""
    sc = _seccomp()
    flt = _allowing(sc)
    # Rules as a binary tree of syscall numbers, not a list (libseccomp 2.5 and later).
    with contextlib.suppress(OSError):
        flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    for name in DENIED:
        flt.add_rule(sc.ERRNO(errno.EPERM), name)
    for name in UNIMPLEMENTED:
        flt.add_rule(sc.ERRNO(errno.ENOSYS), name)
    for rule in arg_rules():
        if rule.above:
            comparison = sc.Arg(rule.arg, sc.GT, rule.value)
        else:
            comparison = sc.Arg(rule.arg, sc.MASKED_EQ, rule.mask, rule.value)
        flt.add_rule(sc.ERRNO(rule.errno), rule.syscall, comparison)
    return flt


# A listening server's second filter (the scoring gRPC front's, loaded by the front itself
# once it listens, on top of the sandbox's): it keeps the sockets it has and accepts
# connections on them, and opens no other, so that code run through a flaw in its parsing
# cannot reach the network the front shares (the platform's databases on 127.0.0.1).
LISTENER_DENIED: dict[str, str] = {
    "socket": "open a socket",
    "socketpair": "open a pair of sockets",
    "connect": "connect a socket",
    "bind": "bind a socket to an address",
    "listen": "listen on a socket",
}


def build_listener() -> Any:
    """The listening server's filter (LISTENER_DENIED), for this machine's architecture."""
    sc = _seccomp()
    flt = _allowing(sc)
    for name in LISTENER_DENIED:
        flt.add_rule(sc.ERRNO(errno.EPERM), name)
    return flt


def compile_bpf(flt: Any = None) -> bytes:
    """A filter (by default `build()`'s) as the BPF program bwrap's `--seccomp` reads."""
    flt = build() if flt is None else flt
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        return f.read()


def default_directory() -> Path:
    """Where the platform keeps its compiled filter: the platform user's cache, which no
    sandbox mounts (`$XDG_CACHE_HOME/dlaas/sandbox`, by default ~/.cache/dlaas/sandbox)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "dlaas" / "sandbox"


def write_once(directory: Path, name: str, data: bytes) -> Path:
    """`directory/name` holding `data`, mode 0644, written (atomically) only if it does
    not already; `directory` is made 0700 and must be the platform user's alone."""
    private_dir(directory)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise FilterUnavailable(f"{directory} is not the platform user's own directory")
    path = directory / name
    with contextlib.suppress(OSError):
        if path.read_bytes() == data and path.stat().st_mode & 0o7777 == 0o644:
            return path
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def install(directory: Path, *, listener: bool = False) -> Path:
    """The compiled filter (with `listener`, the listening server's), in `directory`, named
    by its content (processes of another version of the filter write theirs beside it; a
    prefix written earlier keeps working)."""
    try:
        data = compile_bpf(build_listener() if listener else None)
    except OSError as e:
        raise FilterUnavailable(f"libseccomp could not compile the filter: {e}") from e
    digest = hashlib.sha256(data).hexdigest()[:16]
    name = "listener" if listener else "seccomp"
    try:
        return write_once(directory, f"{name}-{digest}.bpf", data)
    except OSError as e:
        raise FilterUnavailable(f"the seccomp filter could not be written: {e}") from e
