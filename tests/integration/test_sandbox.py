"""Tenants' commands run in the sandbox: a hostile training finds nothing of the platform
or of other trainings, writes nothing outside its own directories, sees only its own
processes, and still does its real work. The same for MPI ranks.

Each attacking learner (or rank) first runs probe.py, which tries everything and writes
what it found to RESULT_DIR, then the real training."""

from __future__ import annotations

import io
import json
import os
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service import sandbox, tenants
from service.db.models import Training
from service.platform import Platform
from service.runtimes import RuntimeInfo
from service.sandbox import limits
from service.settings import Settings
from tests.integration.platform_harness import EXAMPLES, LivePlatform, live_platform
from worker import execution
from worker.backends.local import LocalBackend

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sandbox.probe().available, reason=sandbox.probe().why),
]

PROBE = r"""
import json, os, sys

targets = json.loads(sys.argv[1])
tag = sys.argv[2]
found = {"read": {}, "listed": {}, "wrote": {}, "environ": {}}
for name, path in targets["read"].items():
    try:
        with open(path, "rb") as f:
            found["read"][name] = f.read(200).decode("utf-8", "replace")
    except OSError as e:
        found["read"][name] = None
for name, path in targets["list"].items():
    try:
        found["listed"][name] = sorted(os.listdir(path))
    except OSError:
        found["listed"][name] = None
for name, path in targets["write"].items():
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("pwned")
        found["wrote"][name] = True
    except OSError:
        found["wrote"][name] = False
for pid in targets["environ"]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            found["environ"][str(pid)] = f.read().decode("utf-8", "replace")
    except OSError:
        found["environ"][str(pid)] = None
processes = {}
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                processes[entry] = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            pass
found["processes"] = processes
found["env"] = sorted(os.environ)
with open("/proc/self/status") as f:
    status = f.read().splitlines()
found["caps"] = [l.split()[1] for l in status if l.startswith(("CapEff", "CapPrm", "CapBnd"))]
found["confined"] = [l.split()[1] for l in status if l.startswith(("Seccomp:", "NoNewPrivs"))]
found["uid"] = os.getuid()
found["home"] = os.environ.get("HOME")
out = os.path.join(os.environ["RESULT_DIR"], f"probe-{tag}.json")
with open(out, "w") as f:
    json.dump(found, f)
print("probe done", tag, flush=True)
"""


def code_with_probe(example: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for file in sorted(example.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                z.write(file, file.relative_to(example).as_posix())
        z.writestr("probe.py", PROBE)
    return buf.getvalue()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("sandbox")
    with live_platform(home / "home", f"sqlite:///{home / 'home' / 'dlaas.db'}") as p:
        yield p


@pytest.fixture(scope="module")
def victim(live: LivePlatform) -> Iterator[dict[str, Any]]:
    """Another tenant's training, running, with a file in its model directory."""
    command = (
        "python3 -c \"import os, time; open(os.path.join(os.environ['MODEL_DIR'], "
        "'victim-secret.txt'), 'w').write('victim data'); time.sleep(600)\""
    )
    t = live.submit(
        {
            "name": "victim",
            "framework": {"name": "tensorflow", "version": "2.21", "command": command},
            "compute_configuration": {"name": "K80", "nodes": 1},
        },
        code_with_probe(EXAMPLES / "env"),
    )
    live.wait_for(t["id"], {"RUNNING"})
    ldir = live.settings.work_dir / t["id"] / "learner-1"
    secret = ldir / "model" / "victim-secret.txt"
    deadline = time.monotonic() + 30
    while not secret.exists():
        assert time.monotonic() < deadline, "the victim never wrote its file"
        time.sleep(0.1)
    yield {"id": t["id"], "dir": ldir, "secret": secret}
    live.client.post(f"/v1/trainings/{t['id']}/stop", headers=live.headers)
    live.wait_for(t["id"], {"HALTED", "COMPLETED", "FAILED"})


def targets(live: LivePlatform, victim: dict[str, Any], outside: Path) -> dict[str, Any]:
    settings = live.settings
    home = settings.home_dir
    assert live.worker is not None
    return {
        "read": {
            "admin_api_key": str(settings.admin_key_file),
            "secret_key": str(settings.secret_key_file),
            "database": str(home / "dlaas.db"),
            "victim_file": str(victim["secret"]),
            "victim_spec": str(victim["dir"] / "spec.json"),
            "own_spec": "../spec.json",  # the learner's private directory, next to MODEL_DIR
            "own_status": "../status.json",
            "platform_source": str(Path(__file__).resolve()),
        },
        "list": {"home": str(home), "work": str(settings.work_dir), "root_home": "/root"},
        "write": {
            "into_home": str(home / "pwned.txt"),
            "into_victim": str(victim["dir"] / "model" / "pwned.txt"),
            "outside": str(outside / "pwned.txt"),
            # The wrapper's status channel, next to MODEL_DIR (the working directory).
            "own_status": "../status.json",
        },
        "environ": [os.getpid(), live.worker.pid],
    }


def assert_contained(
    found: dict[str, Any],
    victim: dict[str, Any],
    training_id: str,
    python: str = sys.executable,
    *,
    mpi: bool = False,
) -> None:
    assert found["read"] == dict.fromkeys(found["read"]), found["read"]
    # DLAAS_HOME shows only the path down to the training's own directories.
    assert found["listed"]["home"] == ["work"], found["listed"]
    assert found["listed"]["work"] == [training_id], found["listed"]
    # /root (the platform user's home here) shows at most the runtime's Python below it
    # (`python`: the training's runtime; the platform's, or one under the runtimes dir).
    runtime = {
        Path(p).relative_to("/root").parts[0]
        for p in sandbox.runtime_paths(python)
        if p.startswith("/root/")
    }
    assert set(found["listed"]["root_home"] or []) <= runtime, found["listed"]
    assert found["environ"] == dict.fromkeys(found["environ"]), found["environ"]
    # Only its own processes: the sandbox's init, the shell, python; an MPI rank also its
    # training's mpirun (learner 1) or daemon (the others), which run in its sandbox.
    commands = list(found["processes"].values())
    assert len(commands) <= (8 if mpi else 6), "\n".join(commands)
    # prted's shell: PRRTE sources ./.profile first where the user's login shell is sh
    # (the sandbox's own /etc/passwd), not where it is bash.
    mpi_own = (
        sandbox.bwrap_executable() or "bwrap",
        "/bin/sh -c PRTE_PREFIX=",
        "/bin/sh -c ( test ! -r ./.profile || . ./.profile; PRTE_PREFIX=",
        python,
    )
    mpi_names = ("/prterun ", "/mpirun ", "/prted ")
    # Every process it sees is its own command's (bwrap's init inside, the shell, python).
    assert all(
        "probe.py" in c
        or (
            mpi
            and (c.startswith(mpi_own) or any(n in c.split(" -", 1)[0] + " " for n in mpi_names))
        )
        for c in commands
    ), "\n".join(commands)
    forbidden_names = ("celery", "-m worker", "sleep(600)")
    if not mpi:
        forbidden_names += ("prted", "mpirun")
    for forbidden in forbidden_names:
        assert not any(c.startswith(forbidden) or f" {forbidden}" in c for c in commands), (
            forbidden,
            commands,
        )
    assert not any(name.startswith("DLAAS_") for name in found["env"]), found["env"]
    assert "PYTHONPATH" not in found["env"]
    assert found["caps"] == ["0000000000000000"] * 3, found["caps"]  # no capabilities
    assert sorted(found["confined"]) == ["1", "2"], found["confined"]  # seccomp, no_new_privs
    assert found["uid"] == sandbox.SANDBOX_UID != 0
    assert victim["secret"].read_text() == "victim data"
    assert not (victim["dir"] / "model" / "pwned.txt").exists()


def test_a_hostile_training_finds_nothing_and_still_trains(
    live: LivePlatform, victim: dict[str, Any], tmp_path: Path
) -> None:
    goal = targets(live, victim, tmp_path)
    probe = f"python3 probe.py '{json.dumps(goal)}' learner-$LEARNER_ID"
    command = f"{probe} && python3 train.py --steps 30"
    t = live.submit(
        {
            "name": "attacker",
            "framework": {
                "name": "tensorflow",
                "version": "2.21",
                "command": command,
                "parameter_servers": 0,
            },
            "compute_configuration": {"name": "P100", "nodes": 2},
        },
        code_with_probe(EXAMPLES / "mwms"),
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=300)
    assert done["status"] == "COMPLETED", (done, live.logs(t["id"])[-3000:])
    results = live.results(t["id"])
    assert "model/saved_model.pb" in results  # the real work was done, in the sandbox
    for learner in (1, 2):
        found = json.loads(results[f"probe-learner-{learner}.json"])
        assert_contained(found, victim, t["id"])
        assert found["home"] == str(live.settings.work_dir / t["id"] / f"learner-{learner}/home")
    assert not (live.settings.home_dir / "pwned.txt").exists()
    assert not (tmp_path / "pwned.txt").exists()  # /tmp inside is the sandbox's own
    if limits.machine_cgroup() is None:  # this machine: the training says what is not enforced
        assert "the memory limit (24 GiB) is enforced per process" in done["limits_note"]
        # once, on the training: not in its status messages
        messages = [done["status_message"], *(e["message"] for e in done["status_history"])]
        assert not any("enforced" in (m or "") for m in messages), messages


@pytest.mark.parametrize("framework", ["tensorflow-horovod", "tensorflow-ddl"])
def test_mpi_ranks_are_sandboxed_too(
    live: LivePlatform,
    victim: dict[str, Any],
    tmp_path: Path,
    framework: str,
    mpi_runtime: RuntimeInfo,
) -> None:
    pytest.importorskip("mpi4py", reason="install the mpi extra")
    goal = targets(live, victim, tmp_path)
    command = (
        f"python3 probe.py '{json.dumps(goal)}' rank-$OMPI_COMM_WORLD_RANK "
        "&& python3 train.py --steps 20"
    )
    t = live.submit(
        {
            "name": "mpi-attacker",
            "framework": {"name": framework, "version": "2.21", "command": command},
            "compute_configuration": {"name": "P100", "nodes": 2},
        },
        code_with_probe(EXAMPLES / "mpi-allreduce"),
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=300)
    assert done["status"] == "COMPLETED", (done, live.logs(t["id"])[-3000:])
    results = live.results(t["id"])
    for rank in (0, 1):
        found = json.loads(results[f"probe-rank-{rank}.json"])
        assert_contained(found, victim, t["id"], mpi_runtime.python, mpi=True)
    assert not (live.settings.home_dir / "pwned.txt").exists()
    assert not (tmp_path / "pwned.txt").exists()


def test_another_tenant_is_refused_where_no_sandbox_can_be_made(tmp_path: Path) -> None:
    """Without a sandbox only the local tenant's trainings start (and every tenant's with
    DLAAS_ALLOW_UNSANDBOXED), and the training says why."""
    backend = LocalBackend(tmp_path / "work", use_namespaces=False, use_sandbox=False)
    assert backend.unsandboxed_reason() == "disabled by configuration"

    for allow in (False, True):
        settings = Settings(home=tmp_path / f"home-{allow}", allow_unsandboxed=allow)
        platform = Platform.from_settings(settings)
        try:
            platform.migrate()
            with platform.sessions() as session:
                local, _ = tenants.create_tenant(session, platform.catalog, "local", "standard")
                other, _ = tenants.create_tenant(session, platform.catalog, "acme", "standard")
                session.commit()
                acme = Training(tenant_id=other.id)
                refusal = execution.unsandboxed_refusal(platform, backend, session, acme)
                local_training = Training(tenant_id=local.id)
                allowed = execution.unsandboxed_refusal(platform, backend, session, local_training)
                assert allowed is None
            if allow:
                assert refusal is None
            else:
                assert refusal is not None
                assert "no sandbox can be made" in refusal
                assert "DLAAS_ALLOW_UNSANDBOXED=true" in refusal
        finally:
            platform.close()
