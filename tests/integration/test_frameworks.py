"""Real TensorFlow and real mpirun trainings through the REST API, on the local backend."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.runtimes import RuntimeInfo
from tests.integration.platform_harness import EXAMPLES, LivePlatform, live_platform

pytestmark = pytest.mark.integration

tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("frameworks")
    with live_platform(home / "home", f"sqlite:///{home / 'dlaas.db'}") as p:
        yield p


def manifest(framework: str, command: str, nodes: int, **framework_extra: Any) -> dict[str, Any]:
    return {
        "name": f"{framework}-{nodes}",
        "framework": {"name": framework, "version": "2.21", "command": command, **framework_extra},
        "compute_configuration": {"name": "P100", "nodes": nodes},
        "evaluation_metrics": [{"name": "loss", "regex": r"loss=([0-9.eE+-]+)"}],
    }


def assert_servable(model: dict[str, bytes], tmp_path: Path) -> None:
    """The results hold a SavedModel whose serving_default signature answers."""
    assert "model/saved_model.pb" in model
    for key, data in model.items():
        if key.startswith("model/"):
            (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / key).write_bytes(data)
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    out = loaded.signatures["serving_default"](x=tf.constant([[1.0, 2.0]]))
    assert next(iter(out.values())).shape == (1, 1)


def test_single_learner_saves_a_savedmodel(live: LivePlatform, tmp_path: Path) -> None:
    t = live.submit(
        manifest("tensorflow", "python3 train.py --epochs 3", 1), EXAMPLES / "keras-single"
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"})
    assert done["status"] == "COMPLETED", (done, live.logs(t["id"]))
    history = [h["status"] for h in done["status_history"]]
    assert "RUNNING" in history and history[-1] == "COMPLETED"
    results = live.results(t["id"])
    assert_servable(results, tmp_path)
    metrics = live.client.get(f"/v1/trainings/{t['id']}/metrics", headers=live.headers).json()
    assert len(metrics["loss"]) >= 3


def test_seed_style_parameter_server_training(live: LivePlatform, tmp_path: Path) -> None:
    t = live.submit(
        manifest("tensorflow", "python3 launcher.py --steps 100", 3, parameter_servers=1),
        EXAMPLES / "ps-seed",
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"})
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    assert re.search(r"\[learner 2\] worker=0 step=\d+", logs)
    assert re.search(r"\[learner 3\] worker=1 step=\d+", logs)
    assert "[learner 1] ps=0" in logs
    assert_servable(live.results(t["id"]), tmp_path)


def test_multi_worker_mirrored_strategy(live: LivePlatform, tmp_path: Path) -> None:
    t = live.submit(
        manifest("tensorflow", "python3 train.py --steps 30", 2, parameter_servers=0),
        EXAMPLES / "mwms",
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"})
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    assert "[learner 1] worker=0 step=30" in logs and "[learner 2] worker=1 step=30" in logs
    assert_servable(live.results(t["id"]), tmp_path)


@pytest.mark.parametrize("framework", ["tensorflow-horovod", "tensorflow-ddl"])
def test_mpi_ranks_span_two_learner_hosts(
    live: LivePlatform, framework: str, mpi_runtime: RuntimeInfo
) -> None:
    t = live.submit(
        manifest(framework, "python3 train.py --steps 20", 2), EXAMPLES / "mpi-allreduce"
    )
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"})
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    report = json.loads(live.results(t["id"])["allreduce.json"])
    prefix = f"learner-{t['id']}"
    assert report["size"] == 2 and report["sum"] == 3
    assert sorted(report["hosts"]) == [f"{prefix}-1", f"{prefix}-2"]
    # Each rank runs with its own learner's environment (the rank prefix).
    assert re.search(rf"rank=0 size=2 host={prefix}-1 learner=1", logs)
    assert re.search(rf"rank=1 size=2 host={prefix}-2 learner=2", logs)
    assert ("DDL_OPTIONS=" in logs) is (framework == "tensorflow-ddl")


@pytest.mark.parametrize("framework", ["tensorflow-horovod"])
def test_each_learner_logs_its_own_ranks_once(
    live: LivePlatform, framework: str, mpi_runtime: RuntimeInfo, tmp_path: Path
) -> None:
    """mpirun forwards every rank's output to the launcher (learner 1): each TensorFlow
    start-up notice showed there once per rank. Each rank's output is its learner's."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "notice.py").write_text(
        "import os\n"
        "import tensorflow as tf\n"
        "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
        "print(f'rank={rank} tensorflow={tf.__version__}', flush=True)\n"
    )
    t = live.submit(manifest(framework, "python3 notice.py", 2), code)
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"})
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    by_learner: dict[int, list[str]] = {1: [], 2: []}
    for line in logs.splitlines():
        found = re.match(r"\S+ \[learner (\d)\] (.*)", line)
        assert found, line
        by_learner[int(found.group(1))].append(found.group(2))
    for learner in (1, 2):
        lines = by_learner[learner]
        ranks = [line for line in lines if line.startswith("rank=")]
        assert len(ranks) == 1 and ranks[0].startswith(f"rank={learner - 1} "), lines
        # The notice, where this CPU prompts it, once: this learner's one rank's.
        assert sum("cpu_feature_guard" in line for line in lines) <= 1, lines
    notices = [sum("cpu_feature_guard" in line for line in by_learner[i]) for i in (1, 2)]
    assert notices[0] == notices[1], by_learner
