"""Real Horovod through the platform: a 2-learner tensorflow-horovod training of
examples/horovod-tf2 (as manifests/03-tensorflow-horovod.yaml runs it) in the runtime
horovod-tf2.14, its ranks training in lockstep."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from service.runtimes import RuntimeInfo
from tests.integration.platform_harness import (
    EXAMPLES,
    ROOT,
    RUNTIMES_DIR,
    LivePlatform,
    live_platform,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory, horovod_runtime: RuntimeInfo
) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("horovod")
    with live_platform(home / "home", f"sqlite:///{home / 'dlaas.db'}") as p:
        yield p


def test_the_runtime_provides_horovod_built_with_mpi_and_gloo(
    horovod_runtime: RuntimeInfo,
) -> None:
    provides = horovod_runtime.provides
    assert provides["tensorflow"] == "2.14.1"
    assert provides["horovod"] == "0.28.1"
    check = provides["horovod_check_build"]
    assert re.search(r"\[X\] TensorFlow", check)
    assert re.search(r"\[X\] MPI", check) and re.search(r"\[X\] Gloo", check)
    assert "Open MPI" in provides["mpi"] or "mpirun" in provides["mpi"]


def test_runtimes_list_shows_it_installed(horovod_runtime: RuntimeInfo, tmp_path: Path) -> None:
    env = {
        "DLAAS_HOME": str(tmp_path),
        "DLAAS_RUNTIMES_DIR": str(RUNTIMES_DIR),
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-m", "dlaas.cli", "runtimes", "list", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={**env, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    listed = {r["name"]: r for r in json.loads(out.stdout)}
    assert listed["platform"]["installed"] is True
    horovod = listed["horovod-tf2.14"]
    assert horovod["installed"] is True and horovod["prefix"] == horovod_runtime.prefix
    assert horovod["provides"]["horovod"] == "0.28.1"
    assert {"framework": "tensorflow-horovod", "version": "1.5"} in horovod["serves"]


def test_installing_it_again_is_a_no_op(horovod_runtime: RuntimeInfo, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dlaas.cli", "runtimes", "install", "horovod-tf2.14"],
        capture_output=True,
        text=True,
        check=False,
        env={
            "DLAAS_HOME": str(tmp_path),
            "DLAAS_RUNTIMES_DIR": str(RUNTIMES_DIR),
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
        },
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"horovod-tf2.14: already installed at {horovod_runtime.prefix}" in done.stderr


def test_two_learner_horovod_training_trains_in_lockstep(live: LivePlatform) -> None:
    manifest = yaml.safe_load((ROOT / "manifests" / "03-tensorflow-horovod.yaml").read_text())
    t = live.submit(manifest, EXAMPLES / "horovod-tf2")
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    prefix = f"learner-{t['id']}"
    assert re.search(rf"rank=0 size=2 host={prefix}-1", logs)
    assert re.search(rf"rank=1 size=2 host={prefix}-2", logs)
    checksums = dict(re.findall(r"rank=(\d) checksum=(-?[0-9.]+)", logs))
    assert set(checksums) == {"0", "1"}, logs[-3000:]
    assert checksums["0"] == checksums["1"]
    report = json.loads(live.results(t["id"])["horovod.json"])
    assert report["size"] == 2
    assert f"{report['checksum']:.10f}" == checksums["0"]
    losses = [float(v) for v in re.findall(r"step=\d+ loss=([0-9.eE+-]+)", logs)]
    assert losses and losses[-1] < losses[0]  # it trained
    # Nothing alarming: Open MPI runs without UCX, whose probe of /sys/class/net (absent in
    # the sandbox) logged an ERROR in every rank.
    assert [line for line in logs.splitlines() if "ERROR" in line] == []
    # Rank 0 exported a SavedModel; the host learner the completion rule stopped says so.
    assert "model/saved_model.pb" in live.results(t["id"])
    deadline = time.monotonic() + 30
    while (host := live.get(t["id"])["learners"][1])["exit_code"] is None:
        assert time.monotonic() < deadline, host
        time.sleep(0.2)
    assert (host["status"], host["status_message"]) == ("STOPPED", "the workers completed")
