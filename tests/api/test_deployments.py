"""The deployments API: deploy a COMPLETED training's SavedModel, predict in every payload
form, refusals that state the rule, bad payloads, tenant isolation, rate limits.

The trainings are inserted through the API and completed through the service layer, with
a SavedModel built here with TensorFlow in their results; no worker runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.db.models import Deployment, Training
from service.domain.states import TrainingState
from service.platform import Platform
from service.scoring.predictions import FastPredictions
from service.trainings import record_transition
from tests.conftest import create_tenant, submit

tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")

W = np.array([[3.0], [-2.0]], dtype=np.float32)
RULE = "online deployment (scoring) takes a COMPLETED training"
GUIDE = "README.md#export-a-savedmodel-from-a-distributed-horovod--ddl-training"


class Linear(tf.Module):
    """y = 3*x1 - 2*x2 + 0.5; a second signature takes two inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(W)
        self.b = tf.Variable(0.5)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: Any) -> dict[str, Any]:
        return {"y": tf.matmul(x, self.w) + self.b}

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 2], tf.float32, name="a"),
            tf.TensorSpec([None], tf.int64, name="b"),
        ]
    )
    def two(self, a: Any, b: Any) -> dict[str, Any]:
        return {"y": tf.matmul(a, self.w), "z": tf.cast(b, tf.float32) * 2.0}


class ReadsAFile(tf.Module):
    """serving_default reads a file of the machine it runs on into its answer."""

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: Any) -> dict[str, Any]:
        secret = tf.io.read_file("/etc/hostname")
        return {"y": x + tf.cast(tf.strings.length(secret), tf.float32)}


class Aborting(tf.Module):
    """y = x @ W, but an input above 1000 aborts the process that runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(W)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: Any) -> dict[str, Any]:
        y = tf.matmul(x, self.w)

        def abort() -> Any:
            with tf.control_dependencies([tf.raw_ops.Abort(error_msg="an input above 1000")]):
                return tf.identity(y)

        return {"y": tf.cond(tf.reduce_max(x) > 1000.0, abort, lambda: y)}


def expected(x: list[list[float]]) -> np.ndarray:
    return np.asarray(x, dtype=np.float32) @ W + 0.5


@pytest.fixture(scope="session")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("saved_models")
    module = Linear()
    tf.saved_model.save(
        module,
        str(root / "linear"),
        signatures={"serving_default": module.serve, "two": module.two},
    )
    tf.saved_model.save(module, str(root / "no_default"), signatures={"two": module.two})
    reads = ReadsAFile()
    tf.saved_model.save(
        reads, str(root / "reads_file"), signatures={"serving_default": reads.serve}
    )
    aborting = Aborting()
    tf.saved_model.save(
        aborting, str(root / "aborting"), signatures={"serving_default": aborting.serve}
    )
    return {name: root / name for name in ("linear", "no_default", "reads_file", "aborting")}


def completed_training(
    client: TestClient, headers: dict[str, str], platform: Platform, model: Path | None
) -> str:
    """A training submitted through the API, COMPLETED with `model` as its SavedModel."""
    r = submit(client, headers)
    assert r.status_code == 201, r.text
    training_id: str = r.json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        record_transition(training, TrainingState.COMPLETED, "trained")
        session.commit()
    if model is not None:
        for path in sorted(model.rglob("*")):
            if path.is_file():
                key = f"trainings/{training_id}/results/model/{path.relative_to(model).as_posix()}"
                platform.store.put_file(key, path)
    return training_id


def wait_for(client: TestClient, headers: dict[str, str], deployment_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        body: dict[str, Any] = client.get(
            f"/v1/deployments/{deployment_id}", headers=headers
        ).json()
        if body["status"] != "DEPLOYING" or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def deploy(
    client: TestClient, headers: dict[str, str], platform: Platform, model: Path
) -> dict[str, Any]:
    training_id = completed_training(client, headers, platform, model)
    r = client.post("/v1/deployments", json={"training_id": training_id}, headers=headers)
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "DEPLOYING"
    assert r.headers["location"] == f"/v1/deployments/{r.json()['id']}"
    return wait_for(client, headers, r.json()["id"])


@pytest.fixture
def deployed(
    client: TestClient, tenant: dict[str, str], platform: Platform, saved_models: dict[str, Path]
) -> Iterator[dict[str, Any]]:
    body = deploy(client, tenant, platform, saved_models["linear"])
    assert body["status"] == "READY", body
    yield body


def predict(client: TestClient, headers: dict[str, str], deployment_id: str, body: Any) -> Any:
    url = f"/v1/deployments/{deployment_id}/predictions"
    if isinstance(body, bytes):
        return client.post(url, content=body, headers=headers)
    return client.post(url, json=body, headers=headers)


def test_deploy_shows_the_signature_and_predicts_in_every_form(
    client: TestClient, tenant: dict[str, str], deployed: dict[str, Any]
) -> None:
    assert deployed["signature"] == {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [None, 2]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [None, 1]}],
    }
    assert set(deployed["signatures"]) == {"serving_default", "two"}
    assert deployed["ready_at"] is not None
    d = deployed["id"]
    x = [[1.0, 0.0], [0.0, 1.0], [0.25, -0.5]]

    r = predict(client, tenant, d, {"instances": x})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    np.testing.assert_allclose(r.json()["predictions"], expected(x), atol=1e-5)
    assert int(r.headers["x-ratelimit-remaining"]) == int(r.headers["x-ratelimit-limit"]) - 3

    r = predict(client, tenant, d, {"inputs": {"x": x}})
    np.testing.assert_allclose(r.json()["outputs"], expected(x), atol=1e-5)
    r = predict(client, tenant, d, {"values": x})
    assert r.json()["fields"] == ["y"]
    np.testing.assert_allclose(r.json()["values"], expected(x)[:, None, :], atol=1e-5)

    rows = {"signature_name": "two", "instances": [{"a": [1, 1], "b": 2}, {"a": [0, 1], "b": 5}]}
    assert predict(client, tenant, d, rows).json() == {
        "predictions": [{"y": [1.0], "z": 4.0}, {"y": [-2.0], "z": 10.0}]
    }
    columns = {"signature_name": "two", "inputs": {"a": [[1, 1]], "b": [7]}}
    assert predict(client, tenant, d, columns).json() == {"outputs": {"y": [[1.0]], "z": [14.0]}}


def test_list_and_read(
    client: TestClient, tenant: dict[str, str], deployed: dict[str, Any]
) -> None:
    listed = client.get("/v1/deployments", headers=tenant).json()["items"]
    assert [d["id"] for d in listed] == [deployed["id"]]
    assert listed[0]["name"] == "mnist"  # the training's name by default
    assert listed[0]["predictions_url"] == f"/v1/deployments/{deployed['id']}/predictions"


def test_a_training_that_is_not_completed_is_refused(
    client: TestClient, tenant: dict[str, str]
) -> None:
    training_id = submit(client, tenant).json()["id"]
    r = client.post("/v1/deployments", json={"training_id": training_id}, headers=tenant)
    assert r.status_code == 409
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert "QUEUED, not COMPLETED" in problem["detail"]
    assert RULE in problem["detail"] and GUIDE in problem["detail"]
    assert problem["errors"][0]["field"] == "training_id"
    assert client.get("/v1/deployments", headers=tenant).json()["items"] == []


def test_a_training_without_a_savedmodel_is_refused(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    training_id = completed_training(client, tenant, platform, model=None)
    r = client.post("/v1/deployments", json={"training_id": training_id}, headers=tenant)
    assert r.status_code == 422
    problem = r.json()
    assert (
        "hold no model/saved_model.pb (nor <version>/saved_model.pb) and no model/model.onnx"
        in problem["detail"]
    )
    assert RULE in problem["detail"] and GUIDE in problem["detail"]
    assert problem["errors"][0]["field"] == "training_id"
    # What `dlaas deploy` prints (the fields' messages) points to the export procedure.
    assert "from rank 0: see " + GUIDE in problem["errors"][0]["message"]


def test_a_savedmodel_without_serving_default_fails_with_the_reason(
    client: TestClient, tenant: dict[str, str], platform: Platform, saved_models: dict[str, Path]
) -> None:
    body = deploy(client, tenant, platform, saved_models["no_default"])
    assert body["status"] == "FAILED"
    assert "no 'serving_default' signature (it has: two)" in body["status_message"]
    assert GUIDE in body["status_message"]
    r = predict(client, tenant, body["id"], {"instances": [[1, 2]]})
    assert r.status_code == 409 and "FAILED" in r.json()["detail"]


def test_a_model_that_reads_a_file_is_refused_at_deploy_naming_the_op(
    client: TestClient, tenant: dict[str, str], platform: Platform, saved_models: dict[str, Path]
) -> None:
    body = deploy(client, tenant, platform, saved_models["reads_file"])
    assert body["status"] == "FAILED", body
    message = body["status_message"]
    assert "the model uses the operation ReadFile (in function __inference_serve_" in message
    assert "it cannot be deployed" in message
    assert not body["signatures"]
    r = predict(client, tenant, body["id"], {"instances": [[1, 2]]})
    assert r.status_code == 409 and "FAILED" in r.json()["detail"]
    # Refused before it was loaded: no process serves it; a model without the op deploys.
    assert client.app.state.scoring.cache.cached(body["id"]) is None
    assert deploy(client, tenant, platform, saved_models["linear"])["status"] == "READY"


def test_a_crashing_model_answers_503_while_the_api_and_other_deployments_answer(
    client: TestClient, tenant: dict[str, str], platform: Platform, saved_models: dict[str, Path]
) -> None:
    linear = deploy(client, tenant, platform, saved_models["linear"])
    crashing = deploy(client, tenant, platform, saved_models["aborting"])
    assert linear["status"] == "READY" and crashing["status"] == "READY", (linear, crashing)
    cache = client.app.state.scoring.cache
    # The process serving the other deployment (None where models are loaded in this one).
    linear_process = getattr(cache.cached(linear["id"]).model, "_process", None)
    d = crashing["id"]
    assert predict(client, tenant, d, {"instances": [[1.0, 0.0]]}).json() == {
        "predictions": [[3.0]]
    }

    # The request that crashes the process, and the next one, while it restarts.
    for body in ({"instances": [[5000.0, 0.0]]}, {"instances": [[1.0, 0.0]]}):
        r = predict(client, tenant, d, body)
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert int(r.headers["retry-after"]) >= 1
        detail = r.json()["detail"]
        assert f"the model process of deployment {d} exited (signal 6, SIGABRT)" in detail
        assert "an input above 1000" in detail and "it is being restarted" in detail

    # The API and the other deployment go on, in the same process as before.
    r = predict(client, tenant, linear["id"], {"instances": [[1.0, 0.0]]})
    assert r.status_code == 200 and r.json() == {"predictions": [[3.5]]}
    assert linear_process is not None
    assert cache.cached(linear["id"]).model._process is linear_process
    listed = client.get("/v1/deployments", headers=tenant)
    assert listed.status_code == 200 and len(listed.json()["items"]) == 2
    shown = client.get(f"/v1/deployments/{d}", headers=tenant).json()
    assert shown["status"] == "READY"
    assert "the model process exited (signal 6, SIGABRT)" in shown["status_message"]

    # Restarted, it answers again, and says what happened.
    deadline = time.monotonic() + 120
    while (r := predict(client, tenant, d, {"instances": [[1.0, 0.0]]})).status_code == 503:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
    assert r.status_code == 200 and r.json() == {"predictions": [[3.0]]}
    shown = client.get(f"/v1/deployments/{d}", headers=tenant).json()
    assert "the model process was restarted at" in shown["status_message"]
    assert "after it exited (signal 6, SIGABRT)" in shown["status_message"]


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        (b"not json", "body", "not valid JSON"),
        (b"", "body", "is empty"),
        (b"[1, 2]", "body", "JSON object"),
        ({"instances": []}, "/instances", "is empty"),
        ({"instances": [[1, 2, 3]]}, "/instances", "x expects float32 [None, 2]"),
        ({"inputs": {"x": [1, 2]}}, "/inputs/x", "x expects float32 [None, 2]"),
        ({"instances": [["1", "2"]]}, "/instances", "holds strings"),
        ({"instances": [[1, 2], [3]]}, "/instances/1", "shape of an instance"),
        ({"signature_name": "nope", "instances": [[1, 2]]}, "/signature_name", "no signature"),
        ({"signature_name": "two", "instances": [{"a": [1, 2], "b": 0.5}]}, "/instances/*/b",
         "int64"),
    ],
)  # fmt: skip
def test_bad_payloads_are_problems_naming_the_field(
    client: TestClient,
    tenant: dict[str, str],
    deployed: dict[str, Any],
    body: Any,
    field: str,
    fragment: str,
) -> None:
    r = predict(client, tenant, deployed["id"], body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["errors"][0]["field"] == field
    assert fragment in problem["detail"], problem


def test_bad_deployment_requests(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.post("/v1/deployments", json={}, headers=tenant)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "training_id"
    r = client.post("/v1/deployments", json={"training_id": "x", "nam": "y"}, headers=tenant)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "nam"
    r = client.post("/v1/deployments", json={"training_id": "nosuch"}, headers=tenant)
    assert r.status_code == 404 and "nosuch" in r.json()["detail"]
    assert client.get("/v1/deployments/nosuch", headers=tenant).status_code == 404
    assert client.delete("/v1/deployments/nosuch", headers=tenant).status_code == 404
    r = predict(client, tenant, "nosuch", {"instances": [[1, 2]]})
    assert r.status_code == 404
    assert predict(client, {}, "nosuch", {"instances": [[1, 2]]}).status_code == 401


def test_another_tenant_cannot_see_score_or_delete(
    client: TestClient,
    tenant: dict[str, str],
    platform: Platform,
    deployed: dict[str, Any],
) -> None:
    other = create_tenant(client, "rival")
    d = deployed["id"]
    assert client.get(f"/v1/deployments/{d}", headers=other).status_code == 404
    assert client.get("/v1/deployments", headers=other).json()["items"] == []
    r = predict(client, other, d, {"instances": [[1, 2]]})
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert client.delete(f"/v1/deployments/{d}", headers=other).status_code == 404
    # Nor deploy the first tenant's training.
    r = client.post("/v1/deployments", json={"training_id": deployed["training_id"]}, headers=other)
    assert r.status_code == 404
    assert predict(client, tenant, d, {"instances": [[1, 2]]}).status_code == 200


def test_delete_stops_serving(
    client: TestClient, tenant: dict[str, str], platform: Platform, deployed: dict[str, Any]
) -> None:
    d = deployed["id"]
    assert predict(client, tenant, d, {"instances": [[1, 2]]}).status_code == 200
    assert client.delete(f"/v1/deployments/{d}", headers=tenant).status_code == 204
    assert client.get(f"/v1/deployments/{d}", headers=tenant).status_code == 404
    r = predict(client, tenant, d, {"instances": [[1, 2]]})
    assert r.status_code == 404 and r.json()["type"] == "urn:dlaas:problem:not-found"
    assert list(platform.store.list(f"deployments/{d}/")) == []
    scoring = client.app.state.scoring
    assert scoring.cache.cached(d) is None
    assert not (platform.settings.scoring_dir / "models" / d).exists()


def test_a_deployment_outlives_its_training(
    client: TestClient, tenant: dict[str, str], deployed: dict[str, Any]
) -> None:
    training_id = deployed["training_id"]
    assert client.delete(f"/v1/trainings/{training_id}", headers=tenant).status_code == 204
    r = predict(client, tenant, deployed["id"], {"instances": [[1, 0]]})
    assert r.status_code == 200 and r.json() == {"predictions": [[3.5]]}


def test_predictions_wait_for_ready(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    training_id = submit(client, tenant).json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        session.add(
            Deployment(
                id="deploying1",
                tenant_id=training.tenant_id,
                training_id=training_id,
                name="d",
                status="DEPLOYING",
                model_key="deployments/deploying1/model/",
            )
        )
        session.commit()
    r = predict(client, tenant, "deploying1", {"instances": [[1, 2]]})
    assert r.status_code == 409  # DEPLOYING, or FAILED if the loop got to it first
    assert "answers" in r.json()["detail"]


def test_the_plan_limits_predictions_per_minute(
    client: TestClient, platform: Platform, saved_models: dict[str, Path], one_rate_window: None
) -> None:
    lite = create_tenant(client, "small", "lite")  # 500 predictions a minute
    body = deploy(client, lite, platform, saved_models["linear"])
    assert body["status"] == "READY", body
    d = body["id"]
    batch = {"instances": [[0.0, 1.0]] * 300}
    first = predict(client, lite, d, batch)
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining"] == "200"
    r = predict(client, lite, d, batch)
    assert r.status_code == 429
    assert r.headers["content-type"] == "application/problem+json"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert "500 predictions a minute" in r.json()["detail"]
    assert predict(client, lite, d, {"instances": [[0.0, 1.0]] * 200}).status_code == 200
    r = predict(client, lite, d, {"instances": [[0.0, 1.0]] * 501})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "/instances"


def test_predictions_are_answered_ahead_of_routing(
    client: TestClient, tenant: dict[str, str], deployed: dict[str, Any]
) -> None:
    """FastPredictions answers POST .../predictions itself, with what the route would
    answer (the tests above go through it), and hands everything else to the app."""
    app = client.app
    routed: list[tuple[str, str]] = []

    async def router(scope: Any, receive: Any, send: Any) -> None:
        routed.append((scope["method"], scope["path"]))

    fast = FastPredictions(router)

    async def call(method: str, path: str, body: bytes) -> list[dict[str, Any]]:
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"authorization", tenant["Authorization"].encode())],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "app": app,
        }
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await fast(scope, receive, send)
        return sent

    path = f"/v1/deployments/{deployed['id']}/predictions"
    ok = asyncio.run(call("POST", path, b'{"instances": [[1.0, 0.0]]}'))
    assert ok[0]["status"] == 200
    assert len(json.loads(ok[1]["body"])["predictions"]) == 1
    missing = asyncio.run(call("POST", "/v1/deployments/nosuch/predictions", b"{}"))
    assert missing[0]["status"] == 404
    assert (b"content-type", b"application/problem+json") in missing[0]["headers"]
    assert json.loads(missing[1]["body"])["instance"] == "/v1/deployments/nosuch/predictions"
    assert routed == []
    asyncio.run(call("GET", path, b""))
    asyncio.run(call("POST", f"/v1/deployments/{deployed['id']}", b""))
    assert routed == [("GET", path), ("POST", f"/v1/deployments/{deployed['id']}")]
