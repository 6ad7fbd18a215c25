"""What the sandbox policy turns into: bwrap's arguments, and resource limits planned
from what the machine has."""

from __future__ import annotations

from pathlib import Path

import pytest

from service import sandbox
from service.domain.records import SpecError
from service.sandbox import limits
from service.sandbox.limits import Enforcement, ResourceLimits

GIB = 1024**3
FILES = sandbox.SandboxFiles("/p/seccomp.bpf", "/p/passwd", "/p/group", "/usr/bin/python3")


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_the_policy_shows_the_system_read_only_and_the_jobs_directories_writable() -> None:
    policy = sandbox.SandboxPolicy(
        writable=("/h/work/t1/learner-1/model", "/h/work/t1/results"),
        readonly=("/opt/venv",),
        hidden=("/usr/local/dlaas-home", "/var/lib/elsewhere"),
    )
    argv = sandbox.argv(policy, "/bin/bwrap", FILES)
    assert argv[argv.index("/bin/bwrap") - 1] == "/p/seccomp.bpf" and argv[-1] == "--"
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--die-with-parent"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--unshare-net" not in argv  # a learner keeps its own network namespace
    assert ("/usr", "/usr") in pairs(argv, "--ro-bind")
    assert ("/opt/venv", "/opt/venv") in pairs(argv, "--ro-bind")
    assert pairs(argv, "--bind") == [
        ("/h/work/t1/learner-1/model", "/h/work/t1/learner-1/model"),
        ("/h/work/t1/results", "/h/work/t1/results"),
    ]
    # /etc is bound file by file: never the whole directory.
    etc = [src for src, _ in pairs(argv, "--ro-bind-try") if src.startswith("/etc")]
    assert "/etc" not in etc and "/etc/hosts" in etc
    assert ("/p/passwd", "/etc/passwd") in pairs(argv, "--ro-bind")  # the sandbox's own
    assert "/etc/shadow" not in etc
    tmpfs = [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"]
    # DLAAS_HOME under a bound system directory is covered; elsewhere it is not shown.
    assert tmpfs == ["/usr/local/dlaas-home", "/tmp"]
    # Writable binds come last, so nothing covers them.
    assert argv.index("--bind") > max(i for i, a in enumerate(argv) if a == "--tmpfs")
    assert tuple(argv[i + 1] for i, a in enumerate(argv) if a == "--unsetenv") == ("PYTHONPATH",)


def test_a_model_gets_no_network() -> None:
    argv = sandbox.argv(sandbox.SandboxPolicy(writable=(), network=False), "bwrap", FILES)
    assert "--unshare-net" in argv


def test_plan_uses_a_delegated_cgroup_when_there_is_one(tmp_path: Path) -> None:
    enforcement, notes = limits.plan(
        ResourceLimits(memory_bytes=2 * GIB, cpus=2),
        "t1-1",
        cgroup_root=tmp_path,
        cpus_available=(0, 1, 2, 3),
    )
    assert notes == []
    assert enforcement == Enforcement(
        cgroup=str(tmp_path / "dlaas-t1-1"), memory_max=2 * GIB, cpu_max=2
    )
    limits.prepare(enforcement)
    group = tmp_path / "dlaas-t1-1"
    assert (group / "memory.max").read_text() == str(2 * GIB)
    assert (group / "cpu.max").read_text() == "200000 100000"
    for name in ("memory.max", "cpu.max", "memory.swap.max"):
        (group / name).unlink(missing_ok=True)
    limits.release(enforcement)
    assert not group.exists()


@pytest.mark.parametrize(
    ("cpus", "available", "slot", "affinity", "cpu_note"),
    [
        (2, (0, 1, 2, 3), 0, (0, 1), False),
        (2, (0, 1, 2, 3), 1, (2, 3), False),
        (1, (0, 1), 3, (1,), False),
        (8, (0, 1), 0, None, True),  # more than the machine has: not enforced, said so
    ],
)
def test_plan_falls_back_to_process_limits_and_says_so(
    cpus: int,
    available: tuple[int, ...],
    slot: int,
    affinity: tuple[int, ...] | None,
    cpu_note: bool,
) -> None:
    enforcement, notes = limits.plan(
        ResourceLimits(memory_bytes=24 * GIB, cpus=cpus),
        "t1-1",
        cgroup_root=None,
        cpus_available=available,
        slot=slot,
    )
    assert enforcement == Enforcement(rlimit_as=24 * GIB, cpu_affinity=affinity)
    assert "the memory limit (24 GiB) is enforced per process" in notes[0]
    assert any("the CPU limit (8) is not enforced" in n for n in notes) == cpu_note


def test_no_limits_no_enforcement() -> None:
    assert limits.plan(ResourceLimits(), "x", cgroup_root=None, cpus_available=(0,)) == (
        Enforcement(),
        [],
    )


def test_a_delegated_cgroup_is_found_from_proc(tmp_path: Path) -> None:
    group = tmp_path / "platform.slice" / "dlaas"
    group.mkdir(parents=True)
    mountinfo = f"36 25 0:31 / {tmp_path} rw,relatime - cgroup2 cgroup2 rw\n"
    assert limits.delegated_cgroup("0::/platform.slice/dlaas\n", mountinfo) is None
    (group / "cgroup.subtree_control").write_text("cpu io memory pids\n")
    assert limits.delegated_cgroup("0::/platform.slice/dlaas\n", mountinfo) == group
    (group / "cgroup.subtree_control").write_text("pids\n")  # not delegated
    assert limits.delegated_cgroup("0::/platform.slice/dlaas\n", mountinfo) is None
    assert limits.delegated_cgroup("4:memory:/x\n", mountinfo) is None  # cgroup v1 only


def test_enforcement_from_a_file_is_checked() -> None:
    good = Enforcement(rlimit_as=GIB, cpu_affinity=(0, 1))
    assert Enforcement.from_dict(good.to_dict()) == good
    for bad in ({"rlimit_as": "1"}, {"cpu_affinity": [0, "1"]}, {"other": 1}, []):
        with pytest.raises(SpecError):
            Enforcement.from_dict(bad)
