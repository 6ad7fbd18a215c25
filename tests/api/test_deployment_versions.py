"""Model versions: a training in TensorFlow Serving's layout (`1/`, `2/` SavedModels)
deploys with those versions; requests pick one by number or by label over the platform's
REST route and TensorFlow Serving's gRPC API; a version is added from another training
while requests go on (no restart, none dropped); labels point at loaded versions only;
unloading a version stops its model process.

The two models answer differently (y = x*1, y = x*2), so each answer shows which version
gave it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.platform import Platform
from service.settings import Settings
from tests.api.test_deployments import completed_training, saved_models, wait_for
from tests.conftest import create_tenant

tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")
pytest.importorskip("tensorflow_serving.apis", reason="make install")
from tensorflow_serving.apis import (  # noqa: E402
    model_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

__all__ = ["saved_models"]  # the fixture, shared with test_deployments


class Scale(tf.Module):
    """y = x * factor."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = tf.Variable(factor)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: Any) -> dict[str, Any]:
        return {"y": x * self.factor}


@pytest.fixture(scope="session")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """SavedModels of y = x*1 and y = x*2."""
    root = tmp_path_factory.mktemp("scaled")
    for factor in (1, 2):
        module = Scale(float(factor))
        tf.saved_model.save(
            module, str(root / str(factor)), signatures={"serving_default": module.serve}
        )
    return {1: root / "1", 2: root / "2"}


X = [[1.0, 2.0], [0.5, -1.0]]


def answer_of(factor: int) -> list[list[float]]:
    return (np.asarray(X, np.float32) * factor).tolist()


def upload(platform: Platform, training_id: str, directory: str, model: Path) -> None:
    for path in sorted(model.rglob("*")):
        if path.is_file():
            key = f"trainings/{training_id}/results/{directory}{path.relative_to(model).as_posix()}"
            platform.store.put_file(key, path)


def training_exporting(
    client: TestClient, headers: dict[str, str], platform: Platform, models: dict[str, Path]
) -> str:
    """A COMPLETED training whose results hold `models` (directory -> SavedModel)."""
    training_id = completed_training(client, headers, platform, model=None)
    for directory, model in models.items():
        upload(platform, training_id, directory, model)
    return training_id


def deploy_training(client: TestClient, headers: dict[str, str], training_id: str) -> Any:
    r = client.post("/v1/deployments", json={"training_id": training_id}, headers=headers)
    assert r.status_code == 202, r.text
    return wait_for(client, headers, r.json()["id"])


def predict(client: TestClient, headers: dict[str, str], deployment_id: str, **params: Any) -> Any:
    return client.post(
        f"/v1/deployments/{deployment_id}/predictions",
        params=params,
        json={"instances": X},
        headers=headers,
    )


def factor_of(r: Any) -> int:
    assert r.status_code == 200, r.text
    for factor in (1, 2):
        if r.json()["predictions"] == answer_of(factor):
            return factor
    raise AssertionError(r.text)


def wait_version(
    client: TestClient, headers: dict[str, str], deployment_id: str, version: int
) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        r = client.get(f"/v1/deployments/{deployment_id}/versions", headers=headers)
        assert r.status_code == 200, r.text
        found: dict[str, Any] = next(v for v in r.json()["items"] if v["version"] == version)
        if found["state"] != "DEPLOYING" or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def label(
    client: TestClient, headers: dict[str, str], deployment_id: str, name: str, version: int
) -> Any:
    return client.put(
        f"/v1/deployments/{deployment_id}/labels/{name}", json={"version": version}, headers=headers
    )


@pytest.fixture
def two_versions(
    client: TestClient, tenant: dict[str, str], platform: Platform, scaled: dict[int, Path]
) -> dict[str, Any]:
    training_id = training_exporting(client, tenant, platform, {"1/": scaled[1], "2/": scaled[2]})
    body: dict[str, Any] = deploy_training(client, tenant, training_id)
    assert body["status"] == "READY", body
    return body


def test_a_tf_serving_layout_deploys_with_its_versions(
    client: TestClient, tenant: dict[str, str], two_versions: dict[str, Any]
) -> None:
    d = two_versions["id"]
    assert [(v["version"], v["state"]) for v in two_versions["versions"]] == [
        (1, "READY"),
        (2, "READY"),
    ]
    assert two_versions["default_version"] == 2 and two_versions["labels"] == {}
    assert two_versions["signature"]["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [None, 2]}
    ]

    # The latest by default, as TensorFlow Serving; each version by number.
    assert factor_of(predict(client, tenant, d)) == 2
    assert factor_of(predict(client, tenant, d, version=1)) == 1
    assert factor_of(predict(client, tenant, d, version=2)) == 2
    for params, field in (({"version": 3}, "version"), ({"label": "canary"}, "label")):
        r = predict(client, tenant, d, **params)
        assert r.status_code == 404, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["errors"][0]["field"] == field
    r = predict(client, tenant, d, version="x")
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "version"

    # canary -> 2, stable -> 1: stable is the default from now on.
    assert label(client, tenant, d, "canary", 2).json() == {"label": "canary", "version": 2}
    assert label(client, tenant, d, "stable", 1).status_code == 200
    assert factor_of(predict(client, tenant, d, label="canary")) == 2
    assert factor_of(predict(client, tenant, d, label="stable")) == 1
    assert factor_of(predict(client, tenant, d)) == 1
    shown = client.get(f"/v1/deployments/{d}", headers=tenant).json()
    assert shown["labels"] == {"canary": 2, "stable": 1} and shown["default_version"] == 1
    assert [v["labels"] for v in shown["versions"]] == [["stable"], ["canary"]]
    listed = client.get(f"/v1/deployments/{d}/versions", headers=tenant).json()
    assert listed["labels"] == shown["labels"] and listed["default_version"] == 1

    # Moving a label takes effect at once.
    assert label(client, tenant, d, "canary", 1).status_code == 200
    assert factor_of(predict(client, tenant, d, label="canary")) == 1


def test_labels_point_at_loaded_versions_and_unloading_frees_the_process(
    client: TestClient, tenant: dict[str, str], two_versions: dict[str, Any]
) -> None:
    d = two_versions["id"]
    r = label(client, tenant, d, "stable", 9)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "/version"
    r = label(client, tenant, d, "not a label", 1)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "/label"
    r = client.put(f"/v1/deployments/{d}/labels/stable", json={"version": 0}, headers=tenant)
    assert r.status_code == 422
    assert label(client, tenant, d, "stable", 1).status_code == 200

    # Refused while a label points at it.
    r = client.delete(f"/v1/deployments/{d}/versions/1", headers=tenant)
    assert r.status_code == 409, r.text
    assert r.json()["errors"][0]["field"] == "/labels/stable"
    assert factor_of(predict(client, tenant, d, version=1)) == 1

    scoring = client.app.state.scoring  # type: ignore[attr-defined]
    process = scoring.cache.cached(d, 1).model._process
    assert process._popen.poll() is None
    assert client.delete(f"/v1/deployments/{d}/labels/stable", headers=tenant).status_code == 204
    r = client.delete(f"/v1/deployments/{d}/labels/stable", headers=tenant)
    assert r.status_code == 404
    assert client.delete(f"/v1/deployments/{d}/versions/1", headers=tenant).status_code == 204

    # Its process is stopped, requests for it are 404, the other version answers.
    assert scoring.cache.cached(d, 1) is None
    assert process._popen.poll() is not None
    r = predict(client, tenant, d, version=1)
    assert r.status_code == 404 and r.json()["errors"][0]["field"] == "version"
    assert factor_of(predict(client, tenant, d)) == 2
    versions = client.get(f"/v1/deployments/{d}/versions", headers=tenant).json()
    assert [(v["version"], v["state"]) for v in versions["items"]] == [
        (1, "UNLOADED"),
        (2, "READY"),
    ]
    assert versions["items"][0]["unloaded_at"] is not None
    r = label(client, tenant, d, "stable", 1)  # not loaded any more
    assert r.status_code == 409 and r.json()["errors"][0]["field"] == "/version"
    # The last loaded version stays (delete the deployment instead); unknown ones are 404.
    r = client.delete(f"/v1/deployments/{d}/versions/2", headers=tenant)
    assert r.status_code == 409 and "delete the deployment" in r.json()["detail"]
    assert client.delete(f"/v1/deployments/{d}/versions/5", headers=tenant).status_code == 404

    # Another tenant sees none of it.
    other = create_tenant(client, "other")
    assert client.get(f"/v1/deployments/{d}/versions", headers=other).status_code == 404
    assert label(client, other, d, "stable", 2).status_code == 404
    assert client.delete(f"/v1/deployments/{d}/versions/2", headers=other).status_code == 404


def test_a_version_is_added_without_restart_or_dropped_request(
    client: TestClient,
    tenant: dict[str, str],
    platform: Platform,
    scaled: dict[int, Path],
    saved_models: dict[str, Path],
) -> None:
    first = deploy_training(
        client,
        tenant,
        training_exporting(client, tenant, platform, {"model/": scaled[1]}),
    )
    assert first["status"] == "READY", first
    d = first["id"]
    assert [v["version"] for v in first["versions"]] == [1]
    assert label(client, tenant, d, "stable", 1).status_code == 200
    scoring = client.app.state.scoring  # type: ignore[attr-defined]
    process = scoring.cache.cached(d, 1).model._process

    results: list[tuple[str, int, int]] = []
    stop = threading.Event()

    def load(params: dict[str, Any]) -> None:
        while not stop.is_set():
            r = predict(client, tenant, d, **params)
            answer = factor_of(r) if r.status_code == 200 else 0
            results.append((repr(params), r.status_code, answer))

    clients = [
        threading.Thread(target=load, args=(params,))
        for params in ({}, {}, {"version": 1}, {"label": "stable"})
    ]
    for thread in clients:
        thread.start()
    try:
        time.sleep(0.5)
        second = training_exporting(client, tenant, platform, {"model/": scaled[2]})
        r = client.post(
            f"/v1/deployments/{d}/versions", json={"training_id": second}, headers=tenant
        )
        assert r.status_code == 202, r.text
        assert r.json()["version"] == 2 and r.json()["state"] == "DEPLOYING"
        assert r.headers["location"] == f"/v1/deployments/{d}/versions/2"
        assert wait_version(client, tenant, d, 2)["state"] == "READY"
        time.sleep(0.3)
        assert label(client, tenant, d, "canary", 2).status_code == 200
        time.sleep(0.3)
        assert label(client, tenant, d, "stable", 2).status_code == 200  # the label moved
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)

    errors = [r for r in results if r[1] != 200]
    assert errors == [], Counter(errors)
    assert len(results) > 20
    answers = Counter((params, answer) for params, _, answer in results)
    assert answers[("{'version': 1}", 2)] == 0  # version 1 is version 1 throughout
    assert answers[("{}", 1)] > 0 and answers[("{}", 2)] > 0  # stable moved 1 -> 2
    assert answers[("{'label': 'stable'}", 2)] > 0
    # No restart: version 1 is served by the process that served it before.
    assert scoring.cache.cached(d, 1).model._process is process
    assert factor_of(predict(client, tenant, d, label="canary")) == 2

    # A version whose model does not load is FAILED and never the default.
    broken = training_exporting(client, tenant, platform, {"model/": saved_models["no_default"]})
    r = client.post(f"/v1/deployments/{d}/versions", json={"training_id": broken}, headers=tenant)
    assert r.status_code == 202, r.text
    failed = wait_version(client, tenant, d, 3)
    assert failed["state"] == "FAILED"
    assert "no 'serving_default' signature" in failed["status_message"]
    assert client.delete(f"/v1/deployments/{d}/labels/stable", headers=tenant).status_code == 204
    shown = client.get(f"/v1/deployments/{d}", headers=tenant).json()
    assert shown["status"] == "READY" and shown["default_version"] == 2
    assert factor_of(predict(client, tenant, d)) == 2
    assert predict(client, tenant, d, version=3).status_code == 404
    assert label(client, tenant, d, "canary", 3).status_code == 409


def test_adding_a_version_follows_the_deployment_rules(
    client: TestClient, tenant: dict[str, str], platform: Platform, two_versions: dict[str, Any]
) -> None:
    d = two_versions["id"]
    empty = completed_training(client, tenant, platform, model=None)
    r = client.post(f"/v1/deployments/{d}/versions", json={"training_id": empty}, headers=tenant)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "training_id"
    assert "hold no model/saved_model.pb" in r.json()["detail"]
    r = client.post(f"/v1/deployments/{d}/versions", json={"training_id": "nope"}, headers=tenant)
    assert r.status_code == 404
    r = client.post(f"/v1/deployments/{d}/versions", json={}, headers=tenant)
    assert r.status_code == 422
    r = client.post("/v1/deployments/nosuch/versions", json={"training_id": empty}, headers=tenant)
    assert r.status_code == 404
    versions = client.get(f"/v1/deployments/{d}/versions", headers=tenant).json()["items"]
    assert [v["version"] for v in versions] == [1, 2]  # nothing half-written


# ---- over TensorFlow Serving's gRPC API ----


@pytest.fixture
def grpc_app(settings: Settings) -> Iterator[tuple[TestClient, Platform, int]]:
    platform = Platform.from_settings(settings.model_copy(update={"scoring_grpc_port": 0}))
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as client:
            yield client, platform, client.app.state.grpc_port  # type: ignore[attr-defined]
    finally:
        platform.close()


def test_tf_serving_clients_pick_versions_by_number_and_label(
    grpc_app: tuple[TestClient, Platform, int], scaled: dict[int, Path]
) -> None:
    client, platform, port = grpc_app
    tenant = create_tenant(client, "acme")
    training_id = training_exporting(client, tenant, platform, {"1/": scaled[1], "2/": scaled[2]})
    d = deploy_training(client, tenant, training_id)["id"]
    assert label(client, tenant, d, "canary", 2).status_code == 200
    assert label(client, tenant, d, "stable", 1).status_code == 200
    metadata = [("authorization", tenant["Authorization"])]
    x = np.asarray(X, np.float32)

    def ask(**choice: Any) -> Any:
        spec = model_pb2.ModelSpec(name=d)
        if "version" in choice:
            spec.version.value = choice["version"]
        if "version_label" in choice:
            spec.version_label = choice["version_label"]
        request = predict_pb2.PredictRequest(model_spec=spec)
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
        return request

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for choice, factor, version in (
            ({"version_label": "canary"}, 2, 2),
            ({"version_label": "stable"}, 1, 1),
            ({"version": 2}, 2, 2),
            ({"version": 1}, 1, 1),
            ({}, 1, 1),  # stable is the default
        ):
            answer = stub.Predict(ask(**choice), metadata=metadata, timeout=30)
            np.testing.assert_allclose(tf.make_ndarray(answer.outputs["y"]), x * factor)
            assert answer.model_spec.name == d
            assert answer.model_spec.version.value == version
            assert answer.model_spec.signature_name == "serving_default"
        for choice in ({"version": 7}, {"version_label": "nope"}):
            with pytest.raises(grpc.RpcError) as info:
                stub.Predict(ask(**choice), metadata=metadata, timeout=30)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND, choice
