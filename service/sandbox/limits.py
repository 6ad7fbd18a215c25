"""The memory and CPU of a compute configuration, enforced on a sandboxed process.

Where the machine delegates a cgroup v2 subtree with the memory and cpu controllers to
the platform, each job gets its own cgroup (`memory.max`, `cpu.max`): the limits hold
for the job's processes together. Elsewhere they fall back to process limits: an
address-space limit (RLIMIT_AS) per process and CPU affinity, and the returned notes say
so, for the training's status message. `plan` decides (pure, given what the machine has);
`prepare` creates the cgroup; `apply` runs in the job's first process before it execs.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from service.domain.records import SpecError

_GIB = 1024**3
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class ResourceLimits:
    memory_bytes: int | None = None
    cpus: int | None = None


@dataclass(frozen=True)
class Enforcement:
    """How the limits are enforced on one job; JSON-able (it travels in a file)."""

    cgroup: str | None = None
    memory_max: int | None = None
    cpu_max: int | None = None  # whole CPUs (cpu.max quota)
    rlimit_as: int | None = None
    cpu_affinity: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_affinity"] = list(self.cpu_affinity) if self.cpu_affinity else None
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Enforcement:
        if not isinstance(data, dict) or set(data) - set(cls.__dataclass_fields__):
            raise SpecError("limits: an object with the fields of Enforcement is expected")
        for name in ("memory_max", "cpu_max", "rlimit_as"):
            if data.get(name) is not None and not isinstance(data[name], int):
                raise SpecError(f"limits.{name}: an integer is expected")
        if data.get("cgroup") is not None and not isinstance(data["cgroup"], str):
            raise SpecError("limits.cgroup: a string is expected")
        affinity = data.get("cpu_affinity")
        if affinity is not None and not (
            isinstance(affinity, list) and all(isinstance(c, int) for c in affinity)
        ):
            raise SpecError("limits.cpu_affinity: a list of integers is expected")
        values = {**data, "cpu_affinity": tuple(affinity) if affinity else None}
        return cls(**values)


def _size(n: int) -> str:
    return f"{n / _GIB:g} GiB" if n % (_GIB // 4) == 0 else f"{n} bytes"


def delegated_cgroup(proc_cgroup: str, mountinfo: str) -> Path | None:
    """The platform's own cgroup v2 directory if memory and cpu are delegated to it (its
    `cgroup.subtree_control` enables both and it is writable), else None.

    `proc_cgroup` is /proc/self/cgroup, `mountinfo` /proc/self/mountinfo."""
    path = next((line[3:] for line in proc_cgroup.splitlines() if line.startswith("0::")), None)
    if path is None:
        return None
    mounts = [
        fields[4]
        for line in mountinfo.splitlines()
        if " - cgroup2 " in line and len(fields := line.split()) > 4
    ]
    for mount in mounts:
        directory = Path(mount) / path.lstrip("/")
        try:
            control = (directory / "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if {"memory", "cpu"} <= set(control) and os.access(directory, os.W_OK):
            return directory
    return None


def machine_cgroup() -> Path | None:
    """delegated_cgroup() of this process, read from /proc."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    return delegated_cgroup(cgroup, mountinfo)


def plan(
    limits: ResourceLimits,
    name: str,
    *,
    cgroup_root: Path | None,
    cpus_available: tuple[int, ...],
    slot: int = 0,
) -> tuple[Enforcement, list[str]]:
    """How to enforce `limits` on the job `name`, and what could not be enforced as asked.

    `slot` spreads jobs pinned by affinity over the machine's CPUs."""
    if limits.memory_bytes is None and limits.cpus is None:
        return Enforcement(), []
    if cgroup_root is not None:
        return (
            Enforcement(
                cgroup=str(cgroup_root / f"dlaas-{name}"),
                memory_max=limits.memory_bytes,
                cpu_max=limits.cpus,
            ),
            [],
        )
    notes = []
    affinity = None
    if limits.cpus is not None and limits.cpus < len(cpus_available):
        start = (slot * limits.cpus) % len(cpus_available)
        ordered = cpus_available[start:] + cpus_available[:start]
        affinity = tuple(sorted(ordered[: limits.cpus]))
    if limits.memory_bytes is not None:
        notes.append(
            f"the memory limit ({_size(limits.memory_bytes)}) is enforced per process, as an "
            "address-space limit, not for the learner as a whole: no cgroup v2 with the memory "
            "and cpu controllers is delegated to the platform here"
        )
    if limits.cpus is not None and affinity is None:
        notes.append(
            f"the CPU limit ({limits.cpus}) is not enforced: this machine has "
            f"{len(cpus_available)} CPUs and no cgroup v2 cpu controller is delegated"
        )
    return Enforcement(rlimit_as=limits.memory_bytes, cpu_affinity=affinity), notes


def prepare(enforcement: Enforcement) -> None:
    """Create the job's cgroup with its limits (nothing without one). OSError if it fails."""
    if enforcement.cgroup is None:
        return
    directory = Path(enforcement.cgroup)
    directory.mkdir(exist_ok=True)
    if enforcement.memory_max is not None:
        (directory / "memory.max").write_text(str(enforcement.memory_max))
        with contextlib.suppress(OSError):  # no swap controller: nothing to limit
            (directory / "memory.swap.max").write_text("0")
    if enforcement.cpu_max is not None:
        quota = enforcement.cpu_max * _CPU_PERIOD_US
        (directory / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")


def release(enforcement: Enforcement) -> None:
    """Remove the job's cgroup once its processes are gone (best effort)."""
    if enforcement.cgroup is not None:
        with contextlib.suppress(OSError):
            Path(enforcement.cgroup).rmdir()


def apply(enforcement: Enforcement) -> None:
    """Put the calling process under the limits (before it execs the job's command)."""
    if enforcement.cgroup is not None:
        Path(enforcement.cgroup, "cgroup.procs").write_text(str(os.getpid()))
    if enforcement.rlimit_as is not None:
        resource.setrlimit(resource.RLIMIT_AS, (enforcement.rlimit_as, enforcement.rlimit_as))
    if enforcement.cpu_affinity:
        os.sched_setaffinity(0, enforcement.cpu_affinity)
