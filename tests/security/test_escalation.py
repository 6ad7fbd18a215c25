"""Escalation from inside the sandbox: a tenant's command runs as an unprivileged user of
its own user namespace, without capabilities, with no_new_privs and under the seccomp
filter, so it cannot make a namespace (where it would be root again), mount, debug another
process, or reach the kernel's keyrings or BPF; and its ordinary work (Python, threads,
subprocesses, sockets on its network, TensorFlow) still runs.

The same probe runs in a sandbox made with service.sandbox directly and in a real
training's learner, started by the local backend."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service import sandbox
from tests.integration.platform_harness import EXAMPLES, LivePlatform, live_platform

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sandbox.probe().available, reason=sandbox.probe().why),
]

# Runs inside the sandbox with the standard library only; argv[1]: the system calls'
# numbers on this machine, argv[2]: whether to import TensorFlow. Prints what it found.
PROBE = r"""
import ctypes, errno, json, os, socket, subprocess, sys, threading

numbers = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = {}

with open("/proc/self/status") as f:
    found["status"] = dict(
        line.rstrip("\n").split(":\t", 1) for line in f
        if line.startswith(("Seccomp:", "NoNewPrivs:", "CapEff:", "CapPrm:", "CapBnd:"))
    )
found["uid"] = [os.getuid(), os.geteuid(), os.getgid()]
found["id_u"] = subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip()
found["whoami"] = subprocess.run(["whoami"], capture_output=True, text=True).stdout.strip()

os.makedirs("/tmp/x", exist_ok=True)
commands = {
    "unshare_user": ["unshare", "-U", "true"],
    "unshare_mount": ["unshare", "-m", "true"],
    "unshare_user_map_root": ["unshare", "-r", "true"],
    "mount_tmpfs": ["mount", "-t", "tmpfs", "x", "/tmp/x"],
}
found["commands"] = {}
for name, argv in commands.items():
    try:
        found["commands"][name] = subprocess.run(argv, capture_output=True).returncode
    except OSError as e:
        found["commands"][name] = f"not run: {e}"


PTRACE_TRACEME, PTRACE_ATTACH, PTRACE_DETACH = 0, 16, 17


# The call's outcome (an errno name, or OK), made in a child process of its own: where it
# succeeds (an unconfined sandbox) it must not trace, stop or clone the probe.
def call(name, *args):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ctypes.set_errno(0)
            result = libc.syscall(ctypes.c_long(numbers[name]), *[ctypes.c_long(a) for a in args])
            if name == "clone" and result == 0:
                os._exit(0)  # the clone itself
            out = errno.errorcode.get(ctypes.get_errno(), "?") if result == -1 else "OK"
            if name == "ptrace" and args[0] == PTRACE_ATTACH and result == 0:
                os.waitpid(args[1], 0x40000000)  # __WALL: its stop, then let it go
                libc.syscall(ctypes.c_long(numbers[name]), PTRACE_DETACH, args[1], 0, 0)
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


# A process it did not start: bwrap's init, pid 1 of its PID namespace.
found["calls"] = {
    "ptrace_attach": call("ptrace", PTRACE_ATTACH, 1, 0, 0),
    "ptrace_traceme": call("ptrace", PTRACE_TRACEME, 0, 0, 0),
    "process_vm_readv": call("process_vm_readv", 1, 0, 0, 0, 0, 0),
    "keyctl": call("keyctl", 0, -3, 0),  # KEYCTL_GET_KEYRING_ID, the session keyring
    "add_key": call("add_key", 0, 0, 0, 0, -3),
    "bpf": call("bpf", 0, 0, 0),  # BPF_MAP_CREATE
    "perf_event_open": call("perf_event_open", 0, 0, -1, -1, 0),
    "userfaultfd": call("userfaultfd", 0),
    "unshare_newuser": call("unshare", 0x10000000),
    "unshare_newns": call("unshare", 0x00020000),
    "setns": call("setns", 0, 0),
    "clone_newuser": call("clone", 0x10000000 | 17, 0, 0, 0, 0),
    "clone3": call("clone3", 0, 0),
    "mount": call("mount", 0, 0, 0, 0, 0),
    "pivot_root": call("pivot_root", 0, 0),
    "personality_no_aslr": call("personality", 0x0040000),
    "personality_query": call("personality", 0xFFFFFFFF),
}

# Ordinary work.
work = {}
results = []
threads = [
    threading.Thread(target=lambda i=i: results.append(sum(range(i * 1000))))
    for i in range(4)
]
for t in threads:
    t.start()
for t in threads:
    t.join()
work["threads"] = len(results) == 4
child = subprocess.run(
    [sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True
)
work["subprocess"] = child.stdout.strip() == "42"
pid = os.fork()
if pid == 0:
    os._exit(3)
work["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
client.sendall(b"ping")
work["socket"] = peer.recv(4) == b"ping"
for s in (client, peer, server):
    s.close()
if sys.argv[2] == "tensorflow":
    import tensorflow as tf
    work["tensorflow"] = int(tf.reduce_sum(tf.constant([1, 2, 3]))) == 6
found["work"] = work
print(json.dumps(found))
"""

DENIED_CALLS = (
    "ptrace_attach",
    "ptrace_traceme",
    "process_vm_readv",
    "keyctl",
    "add_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "unshare_newuser",
    "unshare_newns",
    "setns",
    "clone_newuser",
    "mount",
    "pivot_root",
    "personality_no_aslr",
)


def numbers() -> dict[str, int]:
    pyseccomp: Any = pytest.importorskip("pyseccomp")
    names = {
        "ptrace",
        "process_vm_readv",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "unshare",
        "setns",
        "clone",
        "clone3",
        "mount",
        "pivot_root",
        "personality",
    }
    return {n: int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n)) for n in names}


def assert_contained(found: dict[str, Any], *, tensorflow: bool) -> None:
    status = found["status"]
    assert status["Seccomp"] == "2", status  # a filter is loaded
    assert status["NoNewPrivs"] == "1", status
    for caps in ("CapEff", "CapPrm", "CapBnd"):
        assert status[caps] == "0000000000000000", status
    assert found["uid"] == [sandbox.SANDBOX_UID, sandbox.SANDBOX_UID, sandbox.SANDBOX_GID]
    assert found["id_u"] == str(sandbox.SANDBOX_UID) != "0"
    assert found["whoami"] == sandbox.SANDBOX_USER
    for name, code in found["commands"].items():
        assert isinstance(code, int) and code != 0, (name, found["commands"])
    calls = found["calls"]
    for name in DENIED_CALLS:
        assert calls[name] == "EPERM", (name, calls)
    assert calls["clone3"] == "ENOSYS", calls
    assert calls["personality_query"] == "OK", calls
    expected = {"threads", "subprocess", "fork", "socket"}
    if tensorflow:
        expected.add("tensorflow")
    assert found["work"] == dict.fromkeys(expected, True), found["work"]


def test_a_sandboxed_command_cannot_escalate_and_still_works(tmp_path: Path) -> None:
    tensorflow = importlib.util.find_spec("tensorflow") is not None
    job = tmp_path / "job"
    job.mkdir()
    (job / "probe.py").write_text(PROBE)
    policy = sandbox.SandboxPolicy(
        writable=(str(job),), readonly=sandbox.runtime_paths(), cwd=str(job)
    )
    command = [
        *sandbox.argv(policy, sandbox.require()),
        sys.executable,
        "probe.py",
        json.dumps(numbers()),
        "tensorflow" if tensorflow else "-",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, env={"HOME": str(job)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_contained(json.loads(done.stdout.splitlines()[-1]), tensorflow=tensorflow)
    # What it wrote is the platform user's outside: the uid inside maps to it.
    (job / "written").unlink(missing_ok=True)
    subprocess.run([*sandbox.argv(policy, sandbox.require()), "touch", "written"], check=True)
    assert (job / "written").stat().st_uid == (job / "probe.py").stat().st_uid


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("escalation")
    with live_platform(home / "home", f"sqlite:///{home / 'home' / 'dlaas.db'}") as p:
        yield p


def code_with_probe(example: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for file in sorted(example.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                z.write(file, file.relative_to(example).as_posix())
        z.writestr("probe.py", PROBE)
    return buf.getvalue()


def test_a_training_cannot_escalate_and_still_trains(live: LivePlatform) -> None:
    probe = f"python3 probe.py '{json.dumps(numbers())}' tensorflow > \"$RESULT_DIR/probe.json\""
    t = live.submit(
        {
            "name": "escalation",
            "framework": {
                "name": "tensorflow",
                "version": "2.21",
                "command": f"{probe} && python3 train.py --epochs 1 --samples 256",
            },
            "compute_configuration": {"name": "K80", "nodes": 1},
        },
        code_with_probe(EXAMPLES / "keras-single"),
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=300)
    assert done["status"] == "COMPLETED", (done, live.logs(t["id"])[-3000:])
    found = json.loads(live.results(t["id"])["probe.json"])
    assert_contained(found, tensorflow=True)
