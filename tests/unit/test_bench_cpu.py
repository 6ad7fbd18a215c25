"""benchmarks/common.py's CPU accounting (BENCH_CPU=1): each process's CPU time read from
/proc, and the share of a core each used between two readings, busiest first."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks import common
from benchmarks.common import CpuTime, MachineCpu, cpu_report, cpu_times, machine_cpu, steal_share


def _process(proc: Path, pid: int, name: str, utime: int, stime: int, command: bytes) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    # The command in parentheses may itself hold ") " (a process may name itself so).
    fields = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime)]
    (entry / "stat").write_text(f"{pid} ({name}) {' '.join(fields)} 0 0 20 0 1\n")
    (entry / "cmdline").write_bytes(command)


def test_cpu_times_reads_each_process_in_seconds(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    _process(tmp_path, 7, "python", 3 * tick, tick, b"python\0-m\0worker\0")
    _process(tmp_path, 9, "odd) (name", tick // 2, 0, b"front\0--fd\x003\0")
    (tmp_path / "self").mkdir()  # not a process's folder
    (tmp_path / "12").mkdir()  # a process that ended while /proc was read: no stat
    found = cpu_times(tmp_path)
    assert found == {
        7: CpuTime(3.0, 1.0, "python -m worker"),
        9: CpuTime(0.5, 0.0, "front --fd 3"),
    }


def test_the_report_lists_the_busy_processes_busiest_first() -> None:
    before = {1: CpuTime(1.0, 0.0, "api"), 2: CpuTime(5.0, 1.0, "model")}
    after = {
        1: CpuTime(2.6, 0.2, "api"),  # 1.8 s in 2 s: 90% of a core, 10% in the kernel
        2: CpuTime(5.8, 1.2, "model"),  # 1.0 s: 50%
        3: CpuTime(0.01, 0.0, "idle"),  # new since the first reading, 0.5%: left out
        4: CpuTime(0.3, 0.0, "loadgen"),  # new since the first reading: all of it counts
    }
    lines = cpu_report(before, after, seconds=2.0)
    assert [line.split()[-1] for line in lines] == ["api", "model", "loadgen"]
    assert lines[0].startswith(" 90.0% of a core (10.0% in the kernel)  1 api")
    assert lines[2].startswith(" 15.0% of a core (0.0% in the kernel)  4 loadgen")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_this_process_is_seen_using_the_cpu_it_burns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BENCH_PROFILE_DIR", raising=False)
    monkeypatch.setenv("BENCH_CPU", "1")
    with common.profiled(os.getpid(), "burn"):
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
    err = capsys.readouterr().err
    assert err.startswith("CPU during burn (")
    mine = [line for line in err.splitlines() if f"  {os.getpid()} " in line]
    assert len(mine) == 1, err
    assert float(mine[0].split("%")[0]) >= 20.0  # 0.3 s of CPU over about as long


def _stat(path: Path, first: str) -> Path:
    path.write_text(f"{first}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 12345\n")
    return path


def test_the_machine_cpu_is_read_from_proc_stat_first_line(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice: guest is in user.
    stat = _stat(tmp_path / "stat", "cpu  600 0 100 250 10 0 15 25 40 0")
    assert machine_cpu(stat) == MachineCpu(total=1000, stolen=25)


@pytest.mark.parametrize(
    "first",
    ["cpu  600 0 100 250 10 0 15", "intr 1 2 3 4 5 6 7 8 9", "cpu 1 2 3 4 5 6 7 x"],
)
def test_a_stat_line_without_steal_is_not_read(tmp_path: Path, first: str) -> None:
    assert machine_cpu(_stat(tmp_path / "stat", first)) is None


def test_no_stat_file_is_no_reading(tmp_path: Path) -> None:
    assert machine_cpu(tmp_path / "missing") is None


def test_steal_is_the_share_of_the_cpu_time_between_two_readings() -> None:
    before, after = MachineCpu(total=10_000, stolen=100), MachineCpu(total=12_000, stolen=340)
    assert steal_share(before, after) == 0.12  # 240 of 2,000 ticks
    assert steal_share(None, after) is None
    assert steal_share(after, after) is None  # no time between them: no share


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_this_machine_has_a_reading_and_its_share_is_a_fraction() -> None:
    before = machine_cpu()
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    share = steal_share(before, machine_cpu())
    assert share is not None and 0.0 <= share <= 1.0


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_a_block_appends_its_share() -> None:
    shares: list[float | None] = [0.5]
    with common.steal_into(shares):
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    assert len(shares) == 2 and shares[1] is not None and 0.0 <= shares[1] <= 1.0
