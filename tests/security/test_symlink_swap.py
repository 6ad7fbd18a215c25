"""A learner that swaps the files of LOG_DIR, RESULT_DIR and CHECKPOINT_DIR between
regular files and links (symbolic and hard) to secrets, for a few seconds and again as it
ends, and leaves FIFOs, sockets, sparse and growing files there: the trusted side reads
those directories while it runs (the LOG_DIR sync, TensorBoard's reader) and after (the
results, the checkpoints), and must never read a secret into what the tenant can fetch.

Two real runs: a training through the platform on the local backend (the learner
wrapper), and a learner pod's three steps as processes (the agent), as
tests/integration/test_pod_steps.py runs them."""

from __future__ import annotations

import dataclasses
import io
import json
import secrets
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.logs.redis import RedisLogStore
from service.storage import keys
from tests.integration.platform_harness import LivePlatform, live_platform
from tests.integration.test_pod_steps import (  # noqa: F401  (fixtures)
    ARCHIVE_KEY,
    Pod,
    redis_logs,
    stdlib_path,
)

pytestmark = pytest.mark.integration

# The learner's command: the paths of the secrets are in targets.json beside it (their
# contents are nowhere in the archive). Every link it makes is made in a temporary name
# and renamed over the swapped one, as fast as it can.
ATTACK = """
    import ctypes, json, os, select, socket, struct, sys, time
    targets = json.load(open("targets.json"))
    dirs = [os.environ[k] for k in ("LOG_DIR", "RESULT_DIR", "CHECKPOINT_DIR")]
    sockets = []
    for d in dirs:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "benign.txt"), "w") as f:
            f.write("benign")
        os.mkfifo(os.path.join(d, "fifo"))
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.join(d, "sock"))
        sockets.append(s)
        with open(os.path.join(d, "sparse"), "wb") as f:
            f.truncate(1 << 20)
            f.seek((1 << 20) - 1)
            f.write(b"x")
    growing = [open(os.path.join(d, "growing"), "ab") for d in dirs]
    names = ["swap-{}", "events.out.tfevents.1.swap-{}"]

    def plant(d, name, target, kind, i):
        tmp = os.path.join(d, ".tmp-" + name)
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if kind == "hardlink":
            try:
                os.link(target, tmp)  # where the target can be seen (not in a sandbox)
            except OSError:
                kind = "symlink"
        if kind == "symlink":
            os.symlink(target, tmp)
        elif kind == "dirlink":
            os.symlink(os.path.dirname(target), tmp)
        elif kind == "file":
            with open(tmp, "w") as f:
                f.write(f"benign {i}")
        os.replace(tmp, os.path.join(d, name))

    def swap(i, kind):
        for d in dirs:
            for j, target in enumerate(targets):
                for pattern in names:
                    # A name of its own each round: what the platform read of it stays.
                    plant(d, pattern.format(f"{j}-r{i}"), target, kind, i)
        for g in growing:
            g.write(b"g" * 4096)
            g.flush()

    # Regular files until the platform opens LOG_DIR's first file (inotify says when:
    # it has listed and checked the directory by then), then links at once, while it
    # opens the names it listed. The first file is rewritten each round, so it is opened
    # at each pass.
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init1(os.O_NONBLOCK)
    libc.inotify_add_watch(watch, dirs[0].encode(), 0x20)  # IN_OPEN

    def opened_first(timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            select.select([watch], [], [], 0.005)
            try:
                data = os.read(watch, 65536)
            except BlockingIOError:
                continue
            while data:
                size = struct.unpack_from("iIII", data)[3]
                if data[16 : 16 + size].rstrip(b"\\0") == b"aaa-first":
                    return True
                data = data[16 + size :]
        return False

    # Hard links only as it ends, below: one made and removed while the platform opens
    # it can pass for the tenant's own file (see service.tenantfs), which needs a file
    # the tenant can name, and so read, already.
    LINKS = ["symlink", "symlink", "dirlink"]
    end, i = time.monotonic() + float(sys.argv[1]), 0
    while time.monotonic() < end:
        swap(i, "file")
        plant(dirs[0], "aaa-first", None, "file", i)
        opened_first(0.2)
        swap(i, LINKS[i % len(LINKS)])
        time.sleep(0.01)
        i += 1
    # And as it ends: each a hard link where one can be made, else a symbolic one.
    for d in dirs:
        for j, target in enumerate(targets):
            plant(d, f"link-{j}", target, "symlink", i)
            plant(d, f"dirlink-{j}", target, "dirlink", i)
    swap(i, "hardlink")
    print("attack done after", i, "rounds", flush=True)
"""

# What the learner's directories may hold once read: its own names only.
OWN_NAMES = {"aaa-first", "benign.txt", "sparse", "growing", "training-log.txt"}


def own_name(name: str) -> bool:
    name = name.removeprefix(".tmp-")  # a link's temporary name, seen by a sync
    return name in OWN_NAMES or name.startswith(("swap-", "events.out.tfevents.1.swap-"))


def archive(targets: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("attack.py", textwrap.dedent(ATTACK))
        z.writestr("targets.json", json.dumps(targets))
    return buf.getvalue()


@dataclasses.dataclass
class Secrets:
    """The files the learner points its links at, and what must never be read of them."""

    paths: list[str]
    markers: list[bytes]


@pytest.fixture
def victim() -> Iterator[tuple[int, bytes]]:
    """A process of the platform's user with a secret in its environment (as the API's
    holds its database URL and keys): /proc/<pid>/environ is a target."""
    marker = b"ENVIRON-MARKER-" + secrets.token_hex(8).encode()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        env={"DLAAS_VICTIM_SECRET": marker.decode()},
    )
    yield proc.pid, marker
    proc.kill()
    proc.wait()


def other_tenant(tmp_path: Path) -> tuple[str, bytes]:
    """A result of another tenant's training."""
    marker = b"OTHER-TENANT-MARKER-" + secrets.token_hex(8).encode()
    path = tmp_path / "other-tenant" / "results" / "model.bin"
    path.parent.mkdir(parents=True)
    path.write_bytes(marker)
    return str(path), marker


def assert_nothing_leaked(found: dict[str, bytes], leaked: Secrets) -> None:
    assert found, "nothing was read back"
    for where, data in found.items():
        for marker in leaked.markers:
            assert marker not in data, f"{where} holds a secret ({marker[:24]!r})"


def assert_own_content(name: str, data: bytes) -> None:
    """Each file is one the learner wrote: benign text, the sparse file, the growing one
    (as far as fstat saw it)."""
    name = name.removeprefix(".tmp-")
    if name.startswith(("swap-", "events.out.tfevents.1.swap-", "benign", "aaa-first")):
        # Empty: read between the file's creation and its one write.
        assert data == b"" or data.startswith(b"benign"), (name, data[:80])
    elif name == "sparse":
        assert data == b"\0" * ((1 << 20) - 1) + b"x"
    elif name == "growing":
        assert data and set(data) == {ord("g")}, name


# -- the local backend: a training through the platform ------------------------------------


def test_a_training_swapping_links_to_secrets_gets_none_of_them(
    tmp_path: Path, victim: tuple[int, bytes]
) -> None:
    home = tmp_path / "home"
    pid, environ_marker = victim
    other_path, other_marker = other_tenant(tmp_path)
    with live_platform(
        home, f"sqlite:///{home / 'dlaas.db'}", DLAAS_LOG_DIR_SYNC_SECONDS="0.05"
    ) as live:
        # DLAAS_HOME's secrets, where the harness has them.
        names = ("secret_key", "client.json", "dlaas.db")
        platform_secrets = [home / name for name in names if (home / name).exists()]
        assert home / "dlaas.db" in platform_secrets
        leaked = Secrets(
            paths=[*map(str, platform_secrets), f"/proc/{pid}/environ", other_path],
            markers=[environ_marker, other_marker, b"SQLite format 3"]
            + [p.read_bytes() for p in platform_secrets if p.name != "dlaas.db"],
        )
        t = live.submit(
            {
                "name": "symlink-swap",
                "framework": {
                    "name": "tensorflow",
                    "version": "2.21",
                    "command": "python3 attack.py 6",
                },
                "compute_configuration": {"name": "P100", "nodes": 1},
                "evaluation_metrics": {"type": "tensorboard"},
            },
            archive(leaked.paths),
        )
        done = live.wait_for(t["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=240)
        logs = live.logs(t["id"])
        assert done["status"] == "COMPLETED", (done, logs)
        assert "attack done" in logs
        # FINALIZE saves CHECKPOINT_DIR once the training has ended.
        saved_prefix = keys.checkpoints_prefix(t["id"])
        deadline = time.monotonic() + 60
        while not list(live.platform.store.list(saved_prefix)):
            assert time.monotonic() < deadline, "the checkpoints were never saved"
            time.sleep(0.2)
        time.sleep(1)  # all of them
        found = download_everything(live, t["id"])
    found["logs"] = logs.encode()
    assert_nothing_leaked(found, leaked)
    results = {k.removeprefix("results/"): v for k, v in found.items() if k.startswith("results/")}
    assert "benign.txt" in results and "learner-1/logs/benign.txt" in results
    for path, data in results.items():
        name = path.rsplit("/", 1)[-1]
        assert own_name(name), f"{path} is not a file the learner made"
        assert_own_content(name, data)
    saved = [k for k in found if k.startswith("checkpoints/")]
    assert any(k.endswith("/benign.txt") for k in saved), sorted(found)
    for key in saved:
        name = key.rsplit("/", 1)[-1]
        assert own_name(name), key
        assert_own_content(name, found[key])


def download_everything(live: LivePlatform, training_id: str) -> dict[str, bytes]:
    """What the tenant can fetch through the API (the results listing and each file, the
    metrics), and every object the platform stored for the training (its saved
    checkpoints included), by key below the training's prefix."""
    headers = live.headers
    found: dict[str, bytes] = {}
    listing = live.client.get(f"/v1/trainings/{training_id}/results", headers=headers)
    assert listing.status_code == 200, listing.text
    for item in listing.json()["files"]:
        r = live.client.get(f"/v1/trainings/{training_id}/results/{item['path']}", headers=headers)
        assert r.status_code == 200, r.text
        found[f"results/{item['path']}"] = r.content
    metrics = live.client.get(f"/v1/trainings/{training_id}/metrics", headers=headers)
    found["api/metrics"] = metrics.content
    prefix = keys.training_prefix(training_id)
    for info in live.platform.store.list(prefix):
        relative = info.key[len(prefix) :]
        if relative == "model_definition.zip" or relative.startswith("results/"):
            continue  # the tenant's own upload; the results were fetched above
        with live.platform.store.open(info.key) as f:
            found[relative] = f.read()
    return found


# -- a learner pod: fetch, run, agent ----------------------------------------------------


def test_a_pod_swapping_links_to_secrets_gets_none_of_them(
    tmp_path: Path,
    stdlib_path: Path,  # noqa: F811
    redis_logs: RedisLogStore,  # noqa: F811
    victim: tuple[int, bytes],
) -> None:
    pid, environ_marker = victim
    other_path, other_marker = other_tenant(tmp_path)
    agent_secret = tmp_path / "agent-only-secret"
    agent_marker = b"AGENT-ONLY-MARKER-" + secrets.token_hex(8).encode()
    agent_secret.write_bytes(agent_marker)
    pod = Pod(tmp_path / "pod", stdlib_path)
    try:
        saved_prefix = keys.learner_checkpoints_prefix(
            keys.attempt_checkpoints_prefix(pod.training_id, 1), 1
        )
        pod.spec = dataclasses.replace(
            pod.spec,
            log_dir_sync_seconds=0.05,
            tensorboard_metrics=True,
            checkpoints_prefix=saved_prefix,
        )
        pod.spec.write(pod.spec_path)
        leaked = Secrets(
            # The spec is the agent's alone: it names the store and its credentials.
            paths=[str(pod.spec_path), str(agent_secret), f"/proc/{pid}/environ", other_path],
            markers=[environ_marker, other_marker, agent_marker, b'"log_sink"'],
        )
        code = archive(leaked.paths)
        pod.store.put_stream(ARCHIVE_KEY.format(pod.training_id), io.BytesIO(code), len(code))
        assert pod.run_to_end(pod.script("attack.py", "4"), timeout=120) == 0, pod.stderr
        assert pod.stop_agent() == 0, pod.agent_stderr
        found: dict[str, bytes] = {}
        for info in pod.store.list(""):
            if not info.key.endswith("model_definition.zip"):
                with pod.store.open(info.key) as f:
                    found[info.key] = f.read()
        lines = [r.line for r in pod.records(redis_logs)]
        found["log records"] = "\n".join(lines).encode()
        assert any("attack done" in line for line in lines), lines[-5:]
        assert_nothing_leaked(found, leaked)
        saved = {k[len(saved_prefix) :]: v for k, v in found.items() if k.startswith(saved_prefix)}
        results = {k[len(pod.prefix) :]: v for k, v in found.items() if k.startswith(pod.prefix)}
        assert "benign.txt" in saved and "benign.txt" in results, sorted(found)
        assert "learner-1/logs/benign.txt" in results
        for path, data in [*saved.items(), *results.items()]:
            name = path.rsplit("/", 1)[-1]
            assert own_name(name), f"{path} is not a file the learner made"
            assert_own_content(name, data)
    finally:
        pod.kill()
        redis_logs.delete(pod.training_id)
