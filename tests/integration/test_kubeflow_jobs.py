"""Kubeflow jobs, as `kubectl apply -f` takes them, run on the local backend in the
platform's runtimes: the PS/Worker TFJob of examples/kubeflow (examples/ps-seed, which
reads TF_CONFIG as the training operator sets it) and the Launcher/Worker MPIJob
(examples/horovod-tf2 under the platform's own mpirun, in the Horovod runtime)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.runtimes import RuntimeInfo
from tests.integration.platform_harness import (
    EXAMPLES,
    LivePlatform,
    live_platform,
    zip_dir,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("kubeflow")
    with live_platform(home / "home", f"sqlite:///{home / 'dlaas.db'}") as p:
        yield p


def submit_job(live: LivePlatform, job: str, code: Path) -> dict[str, Any]:
    """The job's YAML file as it is, as the manifest."""
    r = live.client.post(
        "/v1/trainings",
        files={
            "manifest": (job, (EXAMPLES / "kubeflow" / job).read_bytes()),
            "model_definition": ("code.zip", zip_dir(code)),
        },
        headers=live.headers,
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def test_a_ps_worker_tfjob_completes(live: LivePlatform) -> None:
    pytest.importorskip("tensorflow", reason="install the tensorflow extra")
    t = submit_job(live, "tfjob-ps.yaml", EXAMPLES / "ps-seed")
    assert t["compute_configuration"] == {"name": "P100", "nodes": 3}
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    # Learner 1 is the PS replica, learners 2 and 3 the Worker replicas.
    assert "[learner 1] ps=0" in logs
    assert re.search(r"\[learner 2\] worker=0 step=\d+", logs)
    assert re.search(r"\[learner 3\] worker=1 step=\d+", logs)
    assert "model/saved_model.pb" in live.results(t["id"])


def test_a_launcher_worker_mpijob_runs_horovod(
    live: LivePlatform, horovod_runtime: RuntimeInfo
) -> None:
    t = submit_job(live, "mpijob-horovod.yaml", EXAMPLES / "horovod-tf2")
    assert t["framework"] == {"name": "tensorflow-horovod", "version": "2.21"}
    assert t["compute_configuration"] == {"name": "P100", "nodes": 2}
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    # The launcher's `mpirun -np 2 ... python3 train_hvd.py` ran as 2 ranks, one per
    # Worker replica, under the platform's mpirun.
    prefix = f"learner-{t['id']}"
    assert re.search(rf"rank=0 size=2 host={prefix}-1", logs)
    assert re.search(rf"rank=1 size=2 host={prefix}-2", logs)
    checksums = dict(re.findall(r"rank=(\d) checksum=(-?[0-9.]+)", logs))
    assert set(checksums) == {"0", "1"} and checksums["0"] == checksums["1"], logs[-3000:]
    assert json.loads(live.results(t["id"])["horovod.json"])["size"] == 2
