"""The seccomp filter, table-tested: the BPF program libseccomp compiles is run here on
(syscall, arguments, architecture) as the kernel would, and its answers checked; and the
prefix that makes bwrap load it."""

from __future__ import annotations

import errno
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service import sandbox
from service.sandbox import seccomp

pyseccomp: Any = pytest.importorskip("pyseccomp", reason="libseccomp is not installed")

ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
AUDIT_ARCH_I386 = 0x40000003
X32_SYSCALL_BIT = 0x40000000


def run_bpf(program: bytes, nr: int, args: tuple[int, ...] = (), arch: int | None = None) -> int:
    """What a classic BPF seccomp program returns for one call (struct seccomp_data:
    nr, arch, instruction pointer, six 64-bit arguments)."""
    arch = pyseccomp.system_arch() if arch is None else arch
    full = (*args, *(0,) * (6 - len(args)))
    data = struct.pack("=iIQ6Q", nr, arch, 0, *full)
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    a = x = 0
    mem = [0] * 16
    pc = 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if cls == 0x00:  # BPF_LD
            mode = code & 0xE0
            if mode == 0x20:  # ABS, word
                a = struct.unpack_from("=I", data, k)[0]
            elif mode == 0x00:
                a = k
            elif mode == 0x60:
                a = mem[k]
            else:
                raise AssertionError(f"unexpected load {code:#x}")
        elif cls == 0x01:  # BPF_LDX
            x = mem[k] if code & 0xE0 == 0x60 else k
        elif cls == 0x02:  # BPF_ST
            mem[k] = a
        elif cls == 0x03:  # BPF_STX
            mem[k] = x
        elif cls == 0x04:  # BPF_ALU
            operand = x if code & 0x08 else k
            op = code & 0xF0
            results = {
                0x00: a + operand,
                0x10: a - operand,
                0x40: a | operand,
                0x50: a & operand,
                0xA0: a ^ operand,
            }
            assert op in results, f"unexpected ALU op {code:#x}"
            a = results[op] & 0xFFFFFFFF
        elif cls == 0x05:  # BPF_JMP
            op = code & 0xF0
            operand = x if code & 0x08 else k
            if op == 0x00:
                pc += k
                continue
            taken = {
                0x10: a == operand,
                0x20: a > operand,
                0x30: a >= operand,
                0x40: bool(a & operand),
            }[op]
            pc += jt if taken else jf
        elif cls == 0x06:  # BPF_RET
            return a if code & 0x18 == 0x10 else k
        elif cls == 0x07:  # BPF_MISC
            if code & 0xF8 == 0x00:
                x = a
            else:
                a = x
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.fixture(scope="module")
def program() -> bytes:
    return seccomp.compile_bpf()


def nr(name: str) -> int:
    number: int = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    assert number >= 0, f"{name} is not a system call of this architecture"
    return number


# What the brief of the filter names, at least.
REQUIRED_EPERM = [
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "setns",
    "unshare",
]


@pytest.mark.parametrize("name", REQUIRED_EPERM)
def test_escalating_calls_are_refused_with_eperm(program: bytes, name: str) -> None:
    assert name in seccomp.DENIED
    assert run_bpf(program, nr(name)) == EPERM
    assert run_bpf(program, nr(name), (1, 2, 3, 4, 5, 6)) == EPERM


@pytest.mark.parametrize("name", sorted(seccomp.DENIED))
def test_every_denied_name_is_a_call_of_this_architecture_and_refused(
    program: bytes, name: str
) -> None:
    assert run_bpf(program, nr(name)) == EPERM


def test_clone3_is_answered_enosys_so_that_libc_falls_back_to_clone(program: bytes) -> None:
    assert run_bpf(program, nr("clone3")) == ENOSYS


CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_SIGHAND, CLONE_THREAD = (
    0x100,
    0x200,
    0x400,
    0x800,
    0x10000,
)
THREAD = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD


@pytest.mark.parametrize(
    ("flags", "answer"),
    [
        (signal.SIGCHLD, ALLOW),  # fork
        (THREAD, ALLOW),  # a thread
        (CLONE_VM | 0x4000 | signal.SIGCHLD, ALLOW),  # vfork (posix_spawn)
        *[(flag | signal.SIGCHLD, EPERM) for flag in seccomp.CLONE_NAMESPACE_FLAGS.values()],
        (0x10000000 | THREAD, EPERM),  # CLONE_NEWUSER among other flags
        (0x10000000 | (1 << 40), EPERM),  # and with high bits set
        (0x7E020000, EPERM),  # every namespace at once
    ],
)
def test_clone_is_refused_only_for_new_namespaces(program: bytes, flags: int, answer: int) -> None:
    assert run_bpf(program, nr("clone"), (flags,)) == answer


@pytest.mark.parametrize(
    ("request_", "answer"),
    [
        (0x5412, EPERM),  # TIOCSTI
        (0x541C, EPERM),  # TIOCLINUX
        (0xFFFFFFFF_00005412, EPERM),  # the kernel reads 32 bits: high bits do not help
        (0x5401, ALLOW),  # TCGETS: isatty()
        (0x5413, ALLOW),  # TIOCGWINSZ
        (0x541B, ALLOW),  # FIONREAD
    ],
)
def test_ioctl_may_not_push_input_into_a_terminal(
    program: bytes, request_: int, answer: int
) -> None:
    assert run_bpf(program, nr("ioctl"), (1, request_)) == answer


@pytest.mark.parametrize(
    ("persona", "answer"),
    [
        (0x0, ALLOW),  # PER_LINUX, the default
        (0xFFFFFFFF, ALLOW),  # the query
        (0x0040000, EPERM),  # ADDR_NO_RANDOMIZE
        (0x0400000, EPERM),  # READ_IMPLIES_EXEC
        (0x0100000, EPERM),  # MMAP_PAGE_ZERO
        (0x0008, EPERM),  # PER_LINUX32
        (0xFFFFFFFE, EPERM),
        (0x80000000, EPERM),
        (0x1, EPERM),
        (0x1_00000000, EPERM),  # above 32 bits
        (0xFFFFFFFF_FFFFFFFF, EPERM),
    ],
)
def test_personality_may_only_be_read_or_set_to_the_default(
    program: bytes, persona: int, answer: int
) -> None:
    assert run_bpf(program, nr("personality"), (persona,)) == answer


@pytest.mark.parametrize(
    "name", ["read", "write", "openat", "mmap", "futex", "socket", "connect", "execve", "wait4"]
)
def test_ordinary_calls_are_allowed(program: bytes, name: str) -> None:
    assert run_bpf(program, nr(name), (3, 0, 0)) == ALLOW


def test_calls_through_another_abi_kill_the_process(program: bytes) -> None:
    if pyseccomp.system_arch() != 0xC000003E:
        pytest.skip("x86_64 only")
    # i386's int 0x80: ptrace is 26 there, a harmless call in x86_64's numbering.
    assert run_bpf(program, 26, arch=AUDIT_ARCH_I386) == KILL_PROCESS
    # x32: x86_64's arch with the x32 bit in the number.
    assert run_bpf(program, X32_SYSCALL_BIT | 101) == KILL_PROCESS


def test_the_filter_is_written_once_0644_in_a_private_directory(tmp_path: Path) -> None:
    directory = tmp_path / "cache" / "sandbox"
    path = seccomp.install(directory)
    assert path.parent == directory and path.name.startswith("seccomp-")
    assert path.read_bytes() == seccomp.compile_bpf()
    assert path.stat().st_mode & 0o7777 == 0o644
    assert directory.stat().st_mode & 0o777 == 0o700
    before = path.stat().st_mtime_ns
    assert seccomp.install(directory) == path and path.stat().st_mtime_ns == before
    path.chmod(0o666)  # a file not as written is written again
    assert seccomp.install(directory) == path and path.stat().st_mode & 0o7777 == 0o644


def test_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir(mode=0o777)
    directory.chmod(0o777)
    with pytest.raises(seccomp.FilterUnavailable, match="not the platform user's own"):
        seccomp.install(directory)


def test_without_libseccomp_there_is_no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails, as uninstalled
    with pytest.raises(seccomp.FilterUnavailable, match="pyseccomp"):
        seccomp.compile_bpf()
    sandbox.probe.cache_clear()
    sandbox.sandbox_files.cache_clear()
    monkeypatch.setattr(sandbox, "bwrap_executable", lambda: "/usr/bin/bwrap")
    try:
        support = sandbox.probe()
        assert not support.available and "libseccomp" in support.why
    finally:
        sandbox.probe.cache_clear()
        sandbox.sandbox_files.cache_clear()


FILES = sandbox.SandboxFiles("/p/seccomp.bpf", "/p/passwd", "/p/group", "/usr/bin/python3")


def test_the_prefix_opens_the_filter_for_bwrap_and_runs_it_unprivileged() -> None:
    argv = sandbox.argv(sandbox.SandboxPolicy(writable=()), "/bin/bwrap", FILES)
    assert argv[:7] == [
        "/usr/bin/python3",
        "-I",
        "-S",
        "-c",
        sandbox.LAUNCH,
        "/p/seccomp.bpf",
        "/bin/bwrap",
    ]
    uid, gid = argv.index("--uid"), argv.index("--gid")
    assert argv[uid + 1] == str(sandbox.SANDBOX_UID) != "0"
    assert argv[gid + 1] == str(sandbox.SANDBOX_GID) != "0"
    assert "--unshare-user" in argv and argv[argv.index("--cap-drop") + 1] == "ALL"
    assert ("/p/passwd", "/etc/passwd") in [
        (argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--ro-bind"
    ]
    assert f"{sandbox.SANDBOX_USER}:x:{sandbox.SANDBOX_UID}:" in sandbox.PASSWD


def fake_bwrap(tmp_path: Path) -> str:
    """A 'bwrap' that shows what it was given and the signals it ignores, then execs the
    command after `--`."""
    script = tmp_path / "bwrap"
    script.write_text(
        "#!/bin/sh\n"
        'head=$(head -c 4 "/proc/$$/fd/$2" | od -An -tx1 | tr -d " \\n")\n'
        'echo "$1" "$2" "$head" $(grep SigIgn "/proc/$$/status")\n'
        'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


COMMAND = """
import os, sys
print(os.getpid())
os.write(int(sys.argv[1]), b"passed\\n")
"""


def test_the_prefix_is_a_plain_exec_pid_exit_code_signals_and_descriptors(
    tmp_path: Path,
) -> None:
    filter_file = tmp_path / "f.bpf"
    filter_file.write_bytes(b"\x20\x00\x00\x00" + b"\0" * 4)
    files = sandbox.SandboxFiles(str(filter_file), "/p/passwd", "/p/group", sys.executable)
    prefix = sandbox.argv(sandbox.SandboxPolicy(writable=()), fake_bwrap(tmp_path), files)
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", COMMAND, str(w)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(w,),
            start_new_session=True,
        )
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(w)
    assert proc.returncode == 0, err
    told, pid = out.splitlines()
    # bwrap got --seccomp on a descriptor holding the filter, not one the caller passed.
    option, fd, head, *ignored = told.split()
    assert option == "--seccomp" and int(fd) not in (0, 1, 2, w) and head == "20000000"
    # One process from the prefix to the command: the pid the caller started.
    assert int(pid) == proc.pid
    # No signal ignored that a plain exec would not ignore (Python ignores SIGPIPE): what a
    # plain child of this process inherits (whatever ran the tests may ignore some).
    plain = subprocess.run(
        ["sh", "-c", 'grep SigIgn "/proc/$$/status"'], capture_output=True, text=True, check=True
    )
    assert ignored == plain.stdout.split()
    with os.fdopen(r) as f:
        assert f.read() == "passed\n"  # the caller's descriptor, at its number
    done = subprocess.run([*prefix, "sh", "-c", "exit 7"], check=False)
    assert done.returncode == 7
    killed = subprocess.run([*prefix, "sh", "-c", "kill -TERM $$"], check=False)
    assert killed.returncode == -signal.SIGTERM
    missing = sandbox.SandboxFiles(str(tmp_path / "gone"), "/p/passwd", "/p/group", sys.executable)
    gone = subprocess.run(
        [*sandbox.argv(sandbox.SandboxPolicy(writable=()), fake_bwrap(tmp_path), missing), "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert gone.returncode != 0 and "gone" in gone.stderr


# -- the listening server's filter (the scoring gRPC front's, on top of the sandbox's) --


@pytest.fixture(scope="module")
def listener() -> bytes:
    return seccomp.compile_bpf(seccomp.build_listener())


@pytest.mark.parametrize("name", ["socket", "socketpair", "connect", "bind", "listen"])
def test_a_listener_opens_no_socket_connection_or_listener(listener: bytes, name: str) -> None:
    assert name in seccomp.LISTENER_DENIED
    assert run_bpf(listener, nr(name), (2, 1, 0)) == EPERM


@pytest.mark.parametrize(
    "name",
    ["accept4", "accept", "read", "write", "sendmsg", "recvmsg", "epoll_wait", "close", "futex"],
)
def test_a_listener_still_accepts_and_serves(listener: bytes, name: str) -> None:
    assert run_bpf(listener, nr(name), (3, 0, 0)) == ALLOW


def test_a_listener_called_through_another_abi_is_killed(listener: bytes) -> None:
    if pyseccomp.system_arch() != 0xC000003E:
        pytest.skip("x86_64 only")
    # i386's socketcall (102) multiplexes socket and connect there.
    assert run_bpf(listener, 102, arch=AUDIT_ARCH_I386) == KILL_PROCESS


def test_the_listener_filter_is_written_beside_the_sandboxs(tmp_path: Path) -> None:
    directory = tmp_path / "sandbox"
    path = seccomp.install(directory, listener=True)
    assert path.name.startswith("listener-") and path.parent == directory
    assert path.read_bytes() == seccomp.compile_bpf(seccomp.build_listener())
    assert path != seccomp.install(directory)
