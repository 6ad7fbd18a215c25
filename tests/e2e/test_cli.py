"""The real `dlaas` executable against a `dlaas up` subprocess, with no flags: the CLI finds
the API and the local tenant's key in the client config that `dlaas up` wrote."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_up import DLAAS, ENV_CODE, Up, start_up

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    platform = start_up(tmp_path_factory.mktemp("cli") / "home")
    try:
        yield platform
    finally:
        platform.stop()
        platform.kill()


def dlaas(up: Up, *args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DLAAS, *map(str, args)],
        env=up.env,  # DLAAS_HOME only: no DLAAS_URL, no DLAAS_API_KEY
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


def write_manifest(path: Path, command: str, **overrides: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "cli",
        "framework": {"name": "tensorflow", "version": "2.21", "command": command},
        "compute_configuration": {"name": "K80", "nodes": 1},
        "evaluation_metrics": [{"name": "loss", "regex": r"loss=([0-9.eE+-]+)"}],
    }
    doc.update(overrides)
    path.write_text(yaml.safe_dump(doc))
    return path


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result


def test_train_logs_show_download_list(up: Up, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.yaml", "python3 slow.py --seconds 2")
    submitted = json.loads(ok(dlaas(up, "train", manifest, ENV_CODE, "--json")).stdout)
    training_id = submitted["id"]
    assert submitted["status"] == "QUEUED"

    logs = ok(dlaas(up, "logs", training_id, "--follow")).stdout.splitlines()
    assert logs[0].endswith("[learner 1] tick=0 loss=1.0"), logs
    assert logs[-1].endswith("[learner 1] done ticks=8"), logs
    assert len(logs) == 9

    shown = json.loads(ok(dlaas(up, "show", training_id, "--json")).stdout)
    assert shown["status"] == "COMPLETED" and shown["id"] == training_id
    human = ok(dlaas(up, "show", training_id)).stdout
    assert "COMPLETED" in human and training_id in human and "History" in human

    dest = tmp_path / "results"
    downloaded = ok(dlaas(up, "download", training_id, dest)).stdout
    log_file = dest / "learner-1" / "training-log.txt"
    assert "done ticks=8" in log_file.read_text()
    assert "learner-1/training-log.txt" in downloaded
    as_json = json.loads(ok(dlaas(up, "download", training_id, tmp_path / "r2", "--json")).stdout)
    assert "learner-1/training-log.txt" in as_json["files"]

    listed = json.loads(ok(dlaas(up, "list", "--json")).stdout)
    assert listed["next_cursor"] is None
    assert training_id in [t["id"] for t in listed["items"]]
    assert training_id in ok(dlaas(up, "list")).stdout

    metrics = json.loads(ok(dlaas(up, "metrics", training_id, "--json")).stdout)
    assert [p["value"] for p in metrics["loss"]] == [1 / (i + 1) for i in range(8)]
    assert "loss" in ok(dlaas(up, "metrics", training_id)).stdout
    assert ok(dlaas(up, "logs", training_id, "--learner", "2")).stdout == ""


def test_a_manifest_breaking_a_rule_names_the_field(up: Up, tmp_path: Path) -> None:
    # Distributed training needs a configuration that supports it; K80 does not.
    manifest = write_manifest(
        tmp_path / "bad.yaml",
        "python3 slow.py",
        compute_configuration={"name": "K80", "nodes": 2},
    )
    result = dlaas(up, "train", manifest, ENV_CODE)
    assert result.returncode != 0
    assert "/compute_configuration/name" in result.stderr
    assert "Validation failed" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""

    as_json = dlaas(up, "train", manifest, ENV_CODE, "--json")
    assert as_json.returncode != 0 and "Traceback" not in as_json.stderr
    problem = json.loads(as_json.stdout)
    assert problem["status"] == 422
    assert [e["field"] for e in problem["errors"]] == ["/compute_configuration/name"]


def test_train_takes_an_ffdl_manifest_as_ffdl_wrote_it(up: Up, tmp_path: Path) -> None:
    ffdl = {
        "name": "ffdl-style",
        "version": "1.0",
        "gpus": 0,
        "cpus": 0.5,
        "memory": "1Gb",
        "learners": 1,
        "framework": {
            "name": "tensorflow",
            "version": "1.5.0-py3",
            "command": "python3 slow.py --seconds 1",
        },
    }
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(yaml.safe_dump(ffdl, sort_keys=False))
    submitted = json.loads(ok(dlaas(up, "train", manifest, ENV_CODE, "--json")).stdout)
    assert submitted["framework"] == {"name": "tensorflow", "version": "1.5"}
    assert submitted["compute_configuration"] == {"name": "K80", "nodes": 1}
    assert submitted["manifest"]["conventions"] == "ffdl"
    assert submitted["submitted_manifest"] == ffdl
    followed = ok(dlaas(up, "logs", submitted["id"], "--follow")).stdout
    assert "done ticks=" in followed

    ffdl["data_stores"] = [{"id": "nfs", "type": "mount_volume"}]
    manifest.write_text(yaml.safe_dump(ffdl))
    refused = dlaas(up, "train", manifest, ENV_CODE)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "/data_stores/0/type" in refused.stderr and "mount_volume" in refused.stderr


def test_failures_exit_non_zero_with_the_message(up: Up, tmp_path: Path) -> None:
    missing = dlaas(up, "show", "nosuchtraining")
    assert missing.returncode == 1
    assert "training nosuchtraining not found" in missing.stderr
    assert "Traceback" not in missing.stderr

    failing = write_manifest(tmp_path / "fail.yaml", "python3 fail.py 7")
    followed = dlaas(up, "train", failing, ENV_CODE, "--follow")
    assert followed.returncode == 1, followed.stdout
    assert "fail.py: exiting with code 7" in followed.stdout
    assert "FAILED" in followed.stdout and "Traceback" not in followed.stderr
    assert "dlaas logs" in followed.stdout.splitlines()[-1]  # what to do next

    done = write_manifest(tmp_path / "done.yaml", "python3 slow.py --seconds 1")
    followed = dlaas(up, "train", done, ENV_CODE, "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    lines = followed.stdout.splitlines()
    ended = next(i for i, line in enumerate(lines) if " COMPLETED" in line)
    training_id = lines[ended].split()[1]
    # It ends with the outcome, then the exact commands that come next.
    assert any(line.endswith(f"dlaas deploy {training_id}") for line in lines[ended:])
    assert any(line.endswith(f"dlaas download {training_id}") for line in lines[ended:])


def test_stop_and_delete(up: Up, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "long.yaml", "python3 slow.py --seconds 60")
    training_id = json.loads(ok(dlaas(up, "train", manifest, ENV_CODE, "--json")).stdout)["id"]
    deadline = time.monotonic() + 60
    while json.loads(ok(dlaas(up, "show", training_id, "--json")).stdout)["status"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    stopping = json.loads(ok(dlaas(up, "stop", training_id, "--json")).stdout)
    assert stopping["stop_requested"] is True
    logs = ok(dlaas(up, "logs", training_id, "--follow")).stdout  # ends when it has stopped
    assert "tick=0" in logs
    assert json.loads(ok(dlaas(up, "show", training_id, "--json")).stdout)["status"] == "HALTED"
    again = dlaas(up, "stop", training_id)
    assert again.returncode == 0 and "HALTED" in again.stdout
    ok(dlaas(up, "delete", training_id))
    assert dlaas(up, "show", training_id).returncode == 1


def test_tenants_deploy_and_predict(up: Up, tmp_path: Path) -> None:
    pytest.importorskip("tensorflow", reason="install the tensorflow extra")
    tenant = json.loads(
        ok(dlaas(up, "tenants", "create", "team", "--plan", "lite", "--json")).stdout
    )
    assert tenant["plan"] == "lite" and tenant["api_key"].startswith("dlaas_")
    assert "team" in ok(dlaas(up, "tenants", "list")).stdout

    code = tmp_path / "code"
    code.mkdir()
    (code / "save.py").write_text(
        "import os\n"
        "import tensorflow as tf\n\n"
        "class Linear(tf.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = tf.Variable([[1.0], [2.0]])\n\n"
        "    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name='x')])\n"
        "    def serve(self, x):\n"
        "        return {'y': tf.matmul(x, self.w) + 0.5}\n\n"
        "m = Linear()\n"
        "tf.saved_model.save(m, os.path.join(os.environ['RESULT_DIR'], 'model'),\n"
        "                    signatures={'serving_default': m.serve})\n"
        "print('saved')\n"
    )
    manifest = write_manifest(tmp_path / "save.yaml", "python3 save.py")
    trained = json.loads(ok(dlaas(up, "train", manifest, code, "--follow", "--json")).stdout)
    assert trained["status"] == "COMPLETED"

    deployment = json.loads(ok(dlaas(up, "deploy", trained["id"], "--json")).stdout)
    assert deployment["status"] == "READY", deployment
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"instances": [[1.0, 2.0], [0.0, 0.0]]}))
    scored = json.loads(
        ok(dlaas(up, "predict", deployment["id"], "--input", inputs, "--json")).stdout
    )
    assert scored == {"predictions": [[5.5], [0.5]]}
    table = ok(dlaas(up, "predict", deployment["id"], "--input", "-", stdin="[[1.0, 1.0]]")).stdout
    assert "[3.5]" in table
    bad = dlaas(up, "predict", deployment["id"], "--input", "-", stdin='{"nope": 1}')
    assert bad.returncode == 2 and "instances" in bad.stderr

    shown = [
        " ".join(line.split())
        for line in ok(dlaas(up, "deployments", "show", deployment["id"])).stdout.splitlines()
    ]
    assert "Signature serving_default" in shown
    assert "input x float32 (None, 2)" in shown and "output y float32 (None, 1)" in shown
    listed = json.loads(ok(dlaas(up, "deployments", "list", "--json")).stdout)
    assert [d["id"] for d in listed["items"]] == [deployment["id"]]
    assert deployment["id"] in ok(dlaas(up, "deployments", "list")).stdout
    ok(dlaas(up, "deployments", "delete", deployment["id"]))
    gone = dlaas(up, "deployments", "show", deployment["id"])
    assert gone.returncode == 1 and "not found" in gone.stderr
