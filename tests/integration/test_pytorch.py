"""PyTorch through the platform on the local backend, in the runtime pytorch2.13: a
2-learner DistributedDataParallel training (examples/pytorch-ddp, every learner's torchrun
on a static rendezvous, Gloo) whose ranks end with identical parameters; the same recipe
with the open DDL's PyTorch API under mpirun (examples/pytorch-ddl, all_reduce_n checked
against MPI_Allreduce); and a training killed mid-run that resumes from its checkpoint on
its second attempt, its torch.utils.tensorboard scalars read as metrics. Every collective of
the open DDL for PyTorch is checked against numpy under mpirun (ddl_ranks/check_ddl_torch.py)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.runtimes import RuntimeInfo
from tests.integration.platform_harness import EXAMPLES, LivePlatform, live_platform
from tests.integration.test_retries import kill_learner, wait_for_log
from tests.integration.test_training_lifecycle import cluster_settings, wait_no_processes
from tests.mpirun import mpirun

pytestmark = pytest.mark.integration

CHECK = Path(__file__).parent / "ddl_ranks" / "check_ddl_torch.py"
FAILING = Path(__file__).parent / "ddl_ranks" / "failing_rank_torch.py"
DDP = EXAMPLES / "pytorch-ddp"
DDL = EXAMPLES / "pytorch-ddl"
ENDED = {"COMPLETED", "FAILED", "HALTED"}


@pytest.fixture
def live(tmp_path: Path, database_url: str, pytorch_runtime: RuntimeInfo) -> Iterator[LivePlatform]:
    with live_platform(tmp_path / "home", database_url, **cluster_settings(database_url)) as p:
        yield p


def manifest(framework: str, command: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": framework,
        "framework": {"name": framework, "version": "2.13", "command": command},
        "compute_configuration": {"name": "P100", "nodes": 2},
        **extra,
    }


def digests(log: str) -> dict[int, str]:
    """Each rank's parameter digest, as the examples print it."""
    return {
        int(rank): digest
        for rank, digest in re.findall(r"rank=(\d+) world_size=2 .*?param_digest=(\w+)", log)
    }


def test_the_runtime_provides_cpu_torch_and_the_ddl_for_pytorch(
    pytorch_runtime: RuntimeInfo,
) -> None:
    provides = pytorch_runtime.provides
    assert provides["torch"] == "2.13.0+cpu" and provides["torch_build"] == "cpu"
    assert provides["ddl"] == "0.1.0" and provides["mpi"].startswith("mpirun (Open MPI) 5.")


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_ddl_for_pytorch_equals_numpy_references(
    pytorch_runtime: RuntimeInfo, ranks: int
) -> None:
    """Every collective of the open DDL's PyTorch API under mpirun (oversubscribed here):
    all_reduce_n (sum, avg, mixed dtypes and shapes, the MPI baseline, `check` passing on a
    right result and catching a wrong one on rank 0 alone), bcast, broadcast_parameters,
    DistributedOptimizer."""
    done = mpirun(pytorch_runtime, ranks, CHECK)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for rank in range(ranks):
        assert f"rank={rank} ok" in out, out[-4000:]
        # ddl's exit handler destroyed the process group: a Gloo thread still holding a
        # collective's tensors while the interpreter finalized aborted the process (134).
        assert f"rank={rank} at exit the process group is initialized: False" in out, out
    # ...and only once every rank had finished: rank 0 stays a second after its work, and
    # no rank closed its connections before it left.
    left = float(re.search(r"rank=0 leaves at ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    destroyed = [float(t) for t in re.findall(r"destroyed its process group at ([\d.]+)", out)]
    assert len(destroyed) == ranks and min(destroyed) >= left, (left, destroyed)
    assert out.count("detected: all_reduce_n differs from MPI_Allreduce") == 1, out[-4000:]
    assert "rank=0 detected" in out
    seen = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(s["rank"] for s in seen) == list(range(ranks))
    assert {(s["size"], s["local_size"], s["backend"]) for s in seen} == {(ranks, ranks, "gloo")}


def test_a_failing_rank_does_not_wait_for_the_others_at_exit(
    pytorch_runtime: RuntimeInfo,
) -> None:
    """ddl's exit waits for every rank (at most DDL_EXIT_WAIT_SECONDS, 60 s) before it
    destroys the process group, except on a rank that is failing: rank 1 raises while rank
    0 waits in a collective for it, and the job ends at once, not a minute later."""
    started = time.monotonic()
    done = mpirun(pytorch_runtime, 2, FAILING, timeout=120)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "RuntimeError: rank 1 fails" in out, out[-4000:]
    assert took < 30, (took, out[-4000:])


def test_without_mpirun_the_ddl_for_pytorch_is_rank_0_of_1(
    pytorch_runtime: RuntimeInfo, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            pytorch_runtime.python,
            "-c",
            "import ddl, torch; "
            "s = ddl.all_reduce_n([torch.tensor([1.5, 2.0])], op='sum', check=1e-6)[0]; "
            "print(ddl.rank(), ddl.size(), ddl.local_size(), s.tolist())",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "0 1 1 [1.5, 2.0]", done.stdout


def test_a_two_learner_ddp_training_ends_with_identical_parameters(
    live: LivePlatform, pytorch_runtime: RuntimeInfo, tmp_path: Path
) -> None:
    t = live.submit(
        manifest(
            "pytorch",
            "python train.py --epochs 3",
            evaluation_metrics=[{"name": "loss", "regex": r"loss=([0-9.eE+-]+)"}],
        ),
        DDP,
    )
    done = live.wait_for(t["id"], ENDED, timeout=600)
    log = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, log[-4000:])
    # One process per learner, two ranks: learner 1's is rank 0, learner 2's rank 1.
    found = digests(log)
    assert set(found) == {0, 1}, log[-4000:]
    assert found[0] == found[1]
    assert re.search(r"\[learner 1\] rank=0 world_size=2", log)
    assert re.search(r"\[learner 2\] rank=1 world_size=2", log)
    # Both learners' losses are metrics; the ONNX model is in the results.
    metrics = live.client.get(f"/v1/trainings/{t['id']}/metrics", headers=live.headers).json()
    assert {p["learner"] for p in metrics["loss"]} == {1, 2}
    assert len(metrics["loss"]) == 6
    results = live.results(t["id"])
    onnx = results["model/model.onnx"]
    assert onnx.startswith(b"\x08") and len(onnx) > 1000  # a ModelProto: ir_version first
    # One file: the weights are inside it, no external data beside it.
    assert [k for k in results if k.startswith("model/")] == ["model/model.onnx"]
    # A valid model, its input named with a symbolic batch dimension (ONNX's own checker).
    (tmp_path / "model.onnx").write_bytes(onnx)
    check = (
        "import onnx, sys; m = onnx.load(sys.argv[1]); onnx.checker.check_model(m); "
        "i = m.graph.input[0]; print(i.name, [d.dim_param or d.dim_value "
        "for d in i.type.tensor_type.shape.dim], m.graph.output[0].name)"
    )
    shown = subprocess.run(
        [pytorch_runtime.python, "-c", check, str(tmp_path / "model.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd="/",
    ).stdout.split()
    assert shown == ["features", "['batch',", "16]", "logits"], shown
    assert [lr["status"] for lr in done["learners"]] == ["COMPLETED", "COMPLETED"]
    deploys_and_scores_as_onnx_runtime(live, t["id"], tmp_path / "model.onnx")


def deploys_and_scores_as_onnx_runtime(live: LivePlatform, training_id: str, model: Path) -> None:
    """The training's ONNX model deploys READY with the graph's signature and answers what
    ONNX Runtime in this process answers, over the platform's route and TensorFlow
    Serving's REST path."""
    ort = pytest.importorskip("onnxruntime", reason="install the onnx extra")
    np = pytest.importorskip("numpy")
    r = live.client.post("/v1/deployments", json={"training_id": training_id}, headers=live.headers)
    assert r.status_code == 202, r.text
    deployment_id = r.json()["id"]
    deadline = time.monotonic() + 180
    while (d := live.client.get(f"/v1/deployments/{deployment_id}", headers=live.headers).json())[
        "status"
    ] == "DEPLOYING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert d["status"] == "READY", d
    signature = d["signature"]
    assert signature["inputs"] == [{"name": "features", "dtype": "float32", "shape": [None, 16]}]
    assert [(t["name"], t["dtype"], t["shape"][0]) for t in signature["outputs"]] == [
        ("logits", "float32", None)
    ]
    x = np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"features": x})
    ours = live.client.post(
        f"/v1/deployments/{deployment_id}/predictions",
        json={"instances": x.tolist()},
        headers=live.headers,
    )
    assert ours.status_code == 200, ours.text
    np.testing.assert_allclose(ours.json()["predictions"], expected, rtol=0, atol=1e-5)
    tfs = live.client.post(
        f"/v1/models/{deployment_id}:predict", json={"instances": x.tolist()}, headers=live.headers
    )
    assert tfs.status_code == 200, tfs.text
    np.testing.assert_allclose(tfs.json()["predictions"], expected, rtol=0, atol=1e-5)


def test_a_pytorch_ddl_training_agrees_with_mpi(live: LivePlatform) -> None:
    t = live.submit(manifest("pytorch-ddl", "python train.py --epochs 3 --check 1e-6"), DDL)
    done = live.wait_for(t["id"], ENDED, timeout=600)
    log = live.logs(t["id"])
    if done["status"] != "COMPLETED":
        # A plain message, printed whole: an assertion's repr of the log is cut short.
        pytest.fail(f"{done['status']}: {done.get('status_message')}\n{log[-12000:]}")
    for rank in (0, 1):
        assert f"rank={rank} all_reduce_n agrees with MPI_Allreduce (check=1e-06)" in log
    found = digests(log)
    assert set(found) == {0, 1} and found[0] == found[1], log[-4000:]
    assert "backend=gloo" in log
    results = live.results(t["id"])
    assert "model/weights.pt" in results and "model/model.onnx" in results


def test_a_killed_pytorch_training_resumes_from_its_checkpoint(live: LivePlatform) -> None:
    t = live.submit(
        manifest(
            "pytorch",
            # A first attempt waits after epoch 2's checkpoint, as a node lost then would.
            "python train.py --epochs 4 --hang-after 2 --onnx-exporter torchscript",
            retry_policy={"max_retries": 1, "retry_on_lost": True},
            evaluation_metrics={"type": "tensorboard"},
        ),
        DDP,
    )
    wait_for_log(live, t["id"], r"\[learner 2\] rank=1 checkpointed epoch 2", timeout=300)
    kill_learner(live, t["id"], 2)

    done = live.wait_for(t["id"], ENDED, timeout=600)
    log = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, log[-4000:])
    assert done["attempt"] == 2
    assert "[learner 2] [dlaas] attempt 1 of 2 failed" in log
    # Both ranks resumed from the epoch they had reached, and went on from there.
    assert "[learner 1] rank=0 resumed from checkpoint epoch 2" in log
    assert "[learner 2] rank=1 resumed from checkpoint epoch 2" in log
    assert log.count("[learner 2] rank=1 epoch=1 ") == 1
    assert "[learner 2] rank=1 epoch=3 " in log
    found = digests(log)
    assert set(found) == {0, 1} and found[0] == found[1]
    # torch.utils.tensorboard's scalars (learner 1's LOG_DIR) are the training's metrics.
    metrics = live.client.get(f"/v1/trainings/{t['id']}/metrics", headers=live.headers).json()
    assert {p["step"] for p in metrics["loss"]} >= {3, 4}
    assert {p["learner"] for p in metrics["loss"]} == {1, 2}
    # torchrun starts its processes in sessions of their own: none is left behind.
    assert wait_no_processes(t["id"]) == []


def test_a_stopped_pytorch_training_halts_and_leaves_no_process(live: LivePlatform) -> None:
    t = live.submit(
        manifest("pytorch", "python train.py --epochs 100 --epoch-seconds 5 --samples 256"), DDP
    )
    wait_for_log(live, t["id"], r"\[learner 2\] rank=1 epoch=1 ", timeout=300)
    r = live.client.post(f"/v1/trainings/{t['id']}/stop", headers=live.headers)
    assert r.status_code == 202
    done = live.wait_for(t["id"], ENDED, timeout=60)
    assert done["status"] == "HALTED", done
    assert wait_no_processes(t["id"]) == []


def test_without_learner_namespaces_the_rendezvous_is_learner_1s_loopback_port(
    tmp_path: Path, pytorch_runtime: RuntimeInfo
) -> None:
    """Where learners cannot have namespaces of their own they share 127.0.0.1: learner 1's
    torchrun serves the rendezvous on its own port there, and the training still runs."""
    with live_platform(
        tmp_path / "home", f"sqlite:///{tmp_path / 'dlaas.db'}", DLAAS_LOCAL_NAMESPACES="false"
    ) as live:
        t = live.submit(
            manifest("pytorch", "python train.py --epochs 1 --onnx-exporter torchscript"), DDP
        )
        done = live.wait_for(t["id"], ENDED, timeout=600)
        log = live.logs(t["id"])
        assert done["status"] == "COMPLETED", (done, log[-4000:])
        # What this machine could not do is its limits note, not the status message.
        assert "learner namespaces are unavailable here" in (done["limits_note"] or "")
        found = digests(log)
        assert set(found) == {0, 1} and found[0] == found[1]
