"""Attack: requests to the MPI relay from inside a training's sandbox.

The relay (worker.learner.mpi_relay) is a thread of learner 1's trusted wrapper that a
sandboxed mpirun asks, through its agent (worker/learner/mpi_client.py), to start a
daemon on another learner. Its socket is in reach of every sandbox of the training, so
whatever arrives on it is the tenant's input: it runs only `sh -c COMMAND` behind the
prefix its table gives for a learner of the training (that learner's namespaces and
sandbox), and refuses anything else with the exit code 255.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.platform_harness import ROOT, LivePlatform, ensure_runtime, live_platform
from worker.backends.local_mpi import CLIENT_SCRIPT
from worker.learner.mpi_relay import (
    MAX_COMMAND,
    MAX_REQUEST,
    SOCKET_NAME,
    MpiRelay,
    RelayHost,
    RelayRefused,
    parse_request,
)

pytestmark = pytest.mark.integration

CLIENT = CLIENT_SCRIPT
HOST = "learner-abc-2"


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Path]:
    """A relay whose one learner's 'sandbox' is a prefix that names itself: the command
    runs behind it, with the learner's environment."""
    directory = tmp_path / "relay"
    directory.mkdir()
    prefix = ("env", "RELAY_PREFIX=learner-2-sandbox")
    hosts = {HOST: RelayHost(prefix=prefix, env={"PATH": "/usr/bin:/bin", "LEARNER_ID": "2"})}
    with MpiRelay(directory, hosts).serving():
        yield directory


def client(relay: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The agent as mpirun runs it: the runtime's `python -I mpi_client.py DIR ...`."""
    return subprocess.run(
        [sys.executable, "-I", str(CLIENT), str(relay), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_learners_command_runs_behind_its_prefix_with_the_clients_descriptors(
    relay: Path,
) -> None:
    command = 'echo "$RELAY_PREFIX learner=$LEARNER_ID in=$(cat)"; echo err >&2; exit 7'
    done = client(relay, "-x", "-o", "StrictHostKeyChecking=no", HOST, command, stdin="hi")
    assert done.stdout == "learner-2-sandbox learner=2 in=hi\n"
    assert done.stderr == "err\n"
    assert done.returncode == 7


def test_a_host_not_of_the_training_is_refused(relay: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = client(relay, "localhost", f"touch {marker}")
    assert done.returncode == 255
    assert "'localhost' is not a learner of this training" in done.stderr
    assert not marker.exists()


def _raw(relay: Path, message: bytes, fds: list[int]) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.connect(str(relay / SOCKET_NAME))
        socket.send_fds(conn, [message], fds)
        reply: int = json.loads(conn.recv(4096))["exit"]
        return reply


def test_a_request_without_the_three_descriptors_is_refused(relay: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    message = json.dumps({"host": HOST, "command": f"touch {marker}"}).encode()
    assert _raw(relay, message, []) == 255
    assert _raw(relay, message, [sys.stdout.fileno()]) == 255
    assert not marker.exists()


def test_a_request_over_the_size_bound_is_refused(relay: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    command = f"touch {marker} #" + "x" * MAX_REQUEST
    message = json.dumps({"host": HOST, "command": command}).encode()
    with open(os.devnull, "rb+") as null:
        fds = [null.fileno()] * 3
        assert _raw(relay, message, fds) == 255
    assert not marker.exists()


def test_a_directory_descriptor_is_refused(relay: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    message = json.dumps({"host": HOST, "command": f"touch {marker}"}).encode()
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _raw(relay, message, [fd, fd, fd]) == 255
    finally:
        os.close(fd)
    assert not marker.exists()


def test_a_silent_connection_is_dropped_and_requests_over_the_bound_refused(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "relay"
    directory.mkdir()
    hosts = {HOST: RelayHost(prefix=(), env={"PATH": "/usr/bin:/bin"})}
    relay = MpiRelay(directory, hosts, max_active=1, request_timeout=1.0)
    with relay.serving(), socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
        silent.connect(str(directory / SOCKET_NAME))
        # The one slot is taken by the silent connection: the next is refused at once.
        done = client(directory, HOST, "echo ran")
        assert done.returncode == 255 and done.stdout == ""
        # Then the silent one is answered (refused) once its time is up, and the slot free.
        silent.settimeout(5)
        assert json.loads(silent.recv(4096)) == {"exit": 255}
        done = client(directory, HOST, "echo ran")
        assert done.returncode == 0 and done.stdout == "ran\n"


HOSTS = {HOST: RelayHost(prefix=("bwrap", "--"), env={})}


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "an object of host and command"),
        (b'{"host": "learner-abc-2"}', "an object of host and command"),
        (
            json.dumps({"host": HOST, "command": "true", "prefix": []}).encode(),
            "an object of host and command",
        ),
        (json.dumps({"host": 2, "command": "true"}).encode(), "not a learner"),
        (json.dumps({"host": "learner-abc-9", "command": "true"}).encode(), "not a learner"),
        (json.dumps({"host": HOST, "command": ""}).encode(), "a string of 1 to"),
        (json.dumps({"host": HOST, "command": ["sh"]}).encode(), "a string of 1 to"),
        (json.dumps({"host": HOST, "command": "a\0b"}).encode(), "a string of 1 to"),
        (json.dumps({"host": HOST, "command": "x" * (MAX_COMMAND + 1)}).encode(), "1 to"),
        (b"[" * 100_000, "not JSON"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "no-command",
        "a-prefix-of-its-own",
        "host-not-a-string",
        "unknown-host",
        "empty-command",
        "command-not-a-string",
        "nul-in-command",
        "command-too-long",
        "deeply-nested",
    ],
)
def test_malformed_requests_are_refused_saying_why(request_: bytes, why: str) -> None:
    with pytest.raises(RelayRefused, match=why):
        parse_request(request_, [0, 1, 2], HOSTS)


def test_a_well_formed_request_names_its_host_and_command() -> None:
    request_ = json.dumps({"host": HOST, "command": "prted --x"}).encode()
    assert parse_request(request_, [0, 1, 2], HOSTS) == (HOST, "prted --x")


# -- end to end: mpirun and its daemons are in the learners' sandboxes ------------------------


@pytest.fixture(scope="module")
def horovod_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    ensure_runtime("horovod-tf2.14")
    root = tmp_path_factory.mktemp("relay")
    with live_platform(root / "home", f"sqlite:///{root / 'dlaas.db'}") as p:
        yield p


def test_every_rank_shares_its_sandbox_with_the_mpi_process_that_started_it(
    horovod_platform: LivePlatform,
) -> None:
    """Each rank's parent (mpirun on learner 1, prted on learner 2) is in the rank's own
    PID namespace, its sandbox's: what mpirun and the daemons start is the tenant's own
    process. A rank that entered a sandbox of its own would see bubblewrap there."""
    manifest = yaml.safe_load((ROOT / "manifests" / "03-tensorflow-horovod.yaml").read_text())
    manifest["framework"]["command"] = (
        'echo "rank=$OMPI_COMM_WORLD_RANK parent=$(cat /proc/$PPID/comm)"'
    )
    t = horovod_platform.submit(manifest, b"PK\x05\x06" + b"\0" * 18)
    done = horovod_platform.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=300)
    logs = horovod_platform.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    parents = dict(re.findall(r"rank=(\d) parent=(\S+)", logs))
    assert parents == {"0": "prterun", "1": "prted"}, logs[-3000:]
