"""A deployment's versions and labels through the Python client and the `dlaas` command
line: a training in TensorFlow Serving's layout deploys with its versions, predictions
pick one, a version is added, labelled and unloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlaas import Client, Conflict, NotFound
from service.domain.states import TrainingState
from service.platform import Platform
from tests.client.test_cli import against_app, run
from tests.client.test_client import manifest, move, zip_bytes

__all__ = ["against_app"]  # the fixture, shared with test_cli


def scale_model(directory: Path, factor: float) -> None:
    """A SavedModel computing y = x * factor (input `x` float32 [None, 2])."""
    tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")

    class Scale(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.factor = tf.Variable(factor)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": x * self.factor}

    model = Scale()
    tf.saved_model.save(model, str(directory), signatures={"serving_default": model.serve})


def training_with(
    client: Client, platform: Platform, tmp_path: Path, models: dict[str, float]
) -> str:
    """A COMPLETED training whose results hold y = x * factor SavedModels, by directory."""
    training = client.trainings.create(manifest(), zip_bytes({"t.py": ""}))
    for directory, factor in models.items():
        local = tmp_path / training.id / directory
        scale_model(local, factor)
        for file in local.rglob("*"):
            if file.is_file():
                relative = file.relative_to(local).as_posix()
                platform.store.put_file(
                    f"trainings/{training.id}/results/{directory}/{relative}", file
                )
    move(platform, training.id, TrainingState.COMPLETED)
    return training.id


def test_versions_and_labels_through_the_client_and_the_cli(
    me: Client,
    platform: Platform,
    tmp_path: Path,
    against_app: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = training_with(me, platform, tmp_path, {"1": 1.0, "2": 2.0})
    deployment = me.deployments.wait(me.deployments.create(first).id, timeout=120)
    assert deployment.ready, deployment
    d = deployment.id
    assert [(v.version, v.state) for v in deployment.versions] == [(1, "READY"), (2, "READY")]
    assert deployment.default_version == 2 and deployment.labels == {}

    x = [[1.0, 2.0]]
    assert me.deployments.predict(d, x) == [[2.0, 4.0]]
    assert me.deployments.predict(d, x, version=1) == [[1.0, 2.0]]
    with pytest.raises(NotFound):
        me.deployments.predict(d, x, version=9)
    me.deployments.set_label(d, "stable", 1)
    me.deployments.set_label(d, "canary", 2)
    assert me.deployments.predict(d, x) == [[1.0, 2.0]]
    assert me.deployments.predict(d, x, label="canary") == [[2.0, 4.0]]
    listed = me.deployments.versions(d)
    assert listed.labels == {"stable": 1, "canary": 2} and listed.default_version == 1
    assert listed.version(2).labels == ("canary",)
    with pytest.raises(Conflict):
        me.deployments.unload_version(d, 1)  # stable points at it

    # Added from another training, waited for, labelled, the old one unloaded.
    second = training_with(me, platform, tmp_path, {"model": 3.0})
    added = me.deployments.add_version(d, second)
    assert (added.version, added.state, added.training_id) == (3, "DEPLOYING", second)
    assert me.deployments.wait_version(d, 3, timeout=120).state == "READY"
    assert me.deployments.predict(d, x, version=3) == [[3.0, 6.0]]
    me.deployments.set_label(d, "stable", 3)
    me.deployments.unload_version(d, 1)
    assert me.deployments.versions(d).version(1).state == "UNLOADED"
    me.deployments.delete_label(d, "canary")
    with pytest.raises(NotFound):
        me.deployments.delete_label(d, "canary")

    # The command line: the same documents with --json, a table without.
    key = ("--api-key", me.api_key or "")
    code, out, _ = run(capsys, *key, "deployments", "versions", "list", d, "--json")
    assert code == 0 and json.loads(out) == me.deployments.versions(d).raw
    code, out, _ = run(capsys, *key, "deployments", "versions", "list", d)
    assert code == 0 and "UNLOADED" in out and "stable" in out and "Default version: 3" in out
    code, out, _ = run(capsys, *key, "deployments", "label", d, "canary", "2", "--json")
    assert code == 0 and json.loads(out) == {"id": d, "label": "canary", "version": 2}
    inputs = tmp_path / "x.json"
    inputs.write_text(json.dumps({"instances": x}))
    code, out, _ = run(
        capsys, *key, "predict", d, "--input", str(inputs), "--label", "canary", "--json"
    )
    assert code == 0 and json.loads(out) == {"predictions": [[2.0, 4.0]]}
    code, out, _ = run(capsys, *key, "deployments", "label", d, "canary", "--delete")
    assert code == 0 and "Removed label canary" in out
    code, out, _ = run(capsys, *key, "deployments", "versions", "unload", d, "2", "--json")
    assert code == 0 and json.loads(out) == {"id": d, "version": 2, "unloaded": True}
    code, out, err = run(capsys, *key, "deployments", "versions", "unload", d, "3")
    assert code == 1 and "stable" in err  # a label points at it
    third = training_with(me, platform, tmp_path, {"model": 4.0})
    code, out, _ = run(capsys, *key, "deployments", "versions", "add", d, third, "--json")
    assert code == 0 and json.loads(out)["state"] == "READY"
    assert json.loads(out)["version"] == 4
    code, out, _ = run(capsys, *key, "deployments", "show", d)
    assert code == 0 and "default version" in out and "UNLOADED" in out
