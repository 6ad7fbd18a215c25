"""The open DDL (runtimes/packages/ddl) in its runtime ddl-tf2.14: every collective checked
against numpy references by tests/integration/ddl_ranks/check_ddl.py, under `mpirun` with 2
ranks and with 4 (oversubscribed on this machine); and DDL's recipe
(examples/ddl-mnist-style, as manifests/04-tensorflow-ddl.yaml runs it) trained by 2 learners
through the platform, deployed and scored."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import yaml

from service.runtimes import RuntimeInfo
from tests.integration.platform_harness import EXAMPLES, ROOT, LivePlatform, live_platform
from tests.integration.test_train_deploy_predict import deploy
from tests.mpirun import mpirun
from worker.backends.local import LocalBackend

pytestmark = pytest.mark.integration

CHECK = Path(__file__).parent / "ddl_ranks" / "check_ddl.py"


def test_the_runtime_provides_ddl_over_horovod(ddl_runtime: RuntimeInfo) -> None:
    provides = ddl_runtime.provides
    assert provides["ddl"] == "0.1.0"
    assert provides["horovod"] == "0.28.1" and provides["tensorflow"] == "2.14.1"
    # Installed from a copy: the package is in the environment, not read from the repository.
    found = subprocess.run(
        [ddl_runtime.python, "-c", "import importlib.util as u; print(u.find_spec('ddl').origin)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd="/",
    ).stdout.strip()
    assert found.startswith(ddl_runtime.prefix), found


def test_its_horovod_loads_the_runtimes_own_mpi(ddl_runtime: RuntimeInfo, tmp_path: Path) -> None:
    """Horovod compiled in another runtime (pip's cache keeps the wheel) names that
    runtime's lib/ in its RUNPATH; learners load this runtime's own libmpi, so it runs
    even where the other runtime is removed."""
    code = (
        "import horovod.tensorflow\n"
        "print(*sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libmpi.so' in l}))"
    )
    env = {**LocalBackend._runtime_env(ddl_runtime), "HOME": str(tmp_path)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run(
        [ddl_runtime.python, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [loaded] = done.stdout.split()
    assert Path(loaded).resolve().is_relative_to(Path(ddl_runtime.prefix).resolve()), loaded
    check = ddl_runtime.provides["horovod_check_build"]
    assert re.search(r"\[X\] TensorFlow", check) and re.search(r"\[X\] MPI", check), check


def test_a_single_process_without_mpirun_is_rank_0_of_1(
    ddl_runtime: RuntimeInfo, tmp_path: Path
) -> None:
    """The recipe's script also runs as the single-learner script it was, `python train.py`
    (MPI's singleton start needs a HOME)."""
    done = subprocess.run(
        [
            ddl_runtime.python,
            "-c",
            "import ddl, tensorflow as tf; "
            "s = ddl.all_reduce_n([tf.constant([1.5, 2.0])], op='sum', check=1e-6)[0]; "
            "print(ddl.rank(), ddl.size(), ddl.local_size(), s.numpy().tolist())",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "0 1 1 [1.5, 2.0]", done.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_collectives_equal_numpy_references(ddl_runtime: RuntimeInfo, ranks: int) -> None:
    done = mpirun(ddl_runtime, ranks, CHECK, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for rank in range(ranks):
        assert f"rank={rank} ok" in out, out[-4000:]
    # The check option caught the result made wrong on rank 0, and only there.
    assert out.count("detected: all_reduce_n differs from MPI_Allreduce") == 1, out[-4000:]
    assert "rank=0 detected" in out
    seen = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(s["rank"] for s in seen) == list(range(ranks))
    assert {s["size"] for s in seen} == {ranks}
    # One host: every rank is local, so there is no second level to reduce across.
    assert {s["local_size"] for s in seen} == {ranks}
    assert not any(s["hierarchical"] for s in seen)


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory, ddl_runtime: RuntimeInfo
) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("ddl")
    with live_platform(home / "home", f"sqlite:///{home / 'dlaas.db'}") as p:
        yield p


def single_learner_loss(runtime: RuntimeInfo, result_dir: Path) -> float:
    """The final loss of the example run by one learner (plain `python`, no mpirun) on the
    2-learner run's samples per step: twice the batch, twice the rate, the same seed."""
    done = subprocess.run(
        [
            runtime.python,
            str(EXAMPLES / "ddl-mnist-style" / "train_ddl.py"),
            *("--steps", "60", "--seed", "1", "--batch-size", "128", "--learning-rate", "0.1"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(result_dir),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "RESULT_DIR": str(result_dir),
        },
        cwd=result_dir,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((result_dir / "ddl.json").read_text())
    assert report["size"] == 1
    loss: float = report["loss"]
    return loss


def test_the_recipe_trains_on_two_learners_and_its_model_deploys_and_scores(
    live: LivePlatform, ddl_runtime: RuntimeInfo, tmp_path: Path
) -> None:
    manifest = yaml.safe_load((ROOT / "manifests" / "04-tensorflow-ddl.yaml").read_text())
    t = live.submit(manifest, EXAMPLES / "ddl-mnist-style")
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    assert "rank=0 size=2" in logs and "rank=1 size=2" in logs
    checksums = dict(re.findall(r"rank=(\d) checksum=(-?[0-9.]+)", logs))
    assert set(checksums) == {"0", "1"} and checksums["0"] == checksums["1"], logs[-3000:]
    losses = [float(v) for v in re.findall(r"step=\d+ loss=([0-9.eE+-]+)", logs)]
    assert losses and losses[-1] < 0.5 * losses[0], losses  # it trained
    results = live.results(t["id"])
    report = json.loads(results["ddl.json"])
    assert report["size"] == 2 and f"{report['checksum']:.10f}" == checksums["0"]
    # Synchronous data parallelism: the same final loss as one learner on the same samples
    # per step, within float rounding (measured: equal to 1e-6).
    (tmp_path / "single").mkdir()
    assert abs(report["loss"] - single_learner_loss(ddl_runtime, tmp_path / "single")) < 1e-4

    # The SavedModel (no DDL op in it) loads with the platform's own TensorFlow ...
    for key, data in results.items():
        if key.startswith("model/"):
            (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / key).write_bytes(data)
    x = np.random.default_rng(0).random((4, 784), dtype=np.float32)
    serve = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
    outputs: dict[str, Any] = serve(x=tf.constant(x))
    own = outputs["y"].numpy()
    np.testing.assert_allclose(own.sum(axis=1), 1.0, atol=1e-5)
    # ... and, deployed, scores as it does.
    deployment = deploy(live.client, live.headers, t["id"])
    assert deployment["status"] == "READY", deployment
    scored = live.client.post(
        f"/v1/deployments/{deployment['id']}/predictions",
        json={"instances": x.tolist()},
        headers=live.headers,
    )
    assert scored.status_code == 200, scored.text
    np.testing.assert_allclose(scored.json()["predictions"], own, rtol=0, atol=1e-4)
