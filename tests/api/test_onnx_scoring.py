"""ONNX models deployed for online scoring: `model/model.onnx` in a training's results
deploys READY with the graph's signature, runs in the sandboxed model process under ONNX
Runtime, and answers the same values as ONNX Runtime in this process over the platform's
REST route and TensorFlow Serving's gRPC Predict (with GetModelMetadata describing it); a
model with an operator of a custom domain, or tensor data outside its directory, is
refused at deploy, naming what."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.api.test_deployments import deploy, predict
from tests.api.test_grpc_scoring import Grpc, auth, refusal, request, served
from tests.conftest import create_tenant

ort = pytest.importorskip("onnxruntime", reason="install the onnx extra")
onnx_models = pytest.importorskip("tests.onnx_models", reason="install the onnx extra")
tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")
from tensorflow_serving.apis import get_model_metadata_pb2, model_pb2  # noqa: E402

__all__ = ["served"]  # the fixture, shared with test_grpc_scoring

X = np.random.default_rng(7).uniform(-1, 1, size=(64, 2)).astype(np.float32)


@pytest.fixture(scope="module")
def onnx_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx_models")
    return {
        name: onnx_models.save(getattr(onnx_models, name)(), root / name)
        for name in ("linear", "custom_domain", "external_outside")
    }


def in_process(model_dir: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(
        str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (y,) = session.run(["y"], {"x": x})
    return np.asarray(y)


def test_an_onnx_model_deploys_and_scores_as_onnx_runtime_does(
    served: Grpc, onnx_dirs: dict[str, Path], one_rate_window: None
) -> None:
    tenant = create_tenant(served.client, "acme")
    deployment = deploy(served.client, tenant, served.platform, onnx_dirs["linear"])
    assert deployment["status"] == "READY", deployment
    assert deployment["signature"] == {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [None, 2]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [None, 2]}],
    }
    assert set(deployment["signatures"]) == {"serving_default"}
    d = deployment["id"]
    expected = in_process(onnx_dirs["linear"], X)

    rest = predict(served.client, tenant, d, {"instances": X.tolist()})
    assert rest.status_code == 200, rest.text
    np.testing.assert_allclose(rest.json()["predictions"], expected, rtol=0, atol=1e-6)
    columns = predict(served.client, tenant, d, {"inputs": {"x": X[:3].tolist()}})
    np.testing.assert_allclose(columns.json()["outputs"], expected[:3], rtol=0, atol=1e-6)

    # TensorFlow Serving's REST path, and its metadata document.
    tfs = served.client.post(
        f"/v1/models/{d}:predict", json={"instances": X.tolist()}, headers=tenant
    )
    assert tfs.status_code == 200, tfs.text
    np.testing.assert_allclose(tfs.json()["predictions"], expected, rtol=0, atol=1e-6)
    meta = served.client.get(f"/v1/models/{d}/metadata", headers=tenant)
    assert meta.status_code == 200, meta.text
    served_def = meta.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert served_def["method_name"] == "tensorflow/serving/predict"
    assert served_def["inputs"]["x"]["dtype"] == "DT_FLOAT"
    assert served_def["inputs"]["x"]["name"] == "x"

    answer = served.stub.Predict(request(d, "serving_default", x=X), metadata=auth(tenant))
    y = tf.make_ndarray(answer.outputs["y"])
    assert y.dtype == np.float32 and y.shape == (64, 2)
    np.testing.assert_allclose(y, expected, rtol=0, atol=1e-6)

    ask = get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec=model_pb2.ModelSpec(name=d), metadata_field=["signature_def"]
    )
    defs = get_model_metadata_pb2.SignatureDefMap()
    assert (
        served.stub.GetModelMetadata(ask, metadata=auth(tenant))
        .metadata["signature_def"]
        .Unpack(defs)
    )
    serve = defs.signature_def["serving_default"]
    assert serve.inputs["x"].dtype == tf.float32.as_datatype_enum
    assert [dim.size for dim in serve.inputs["x"].tensor_shape.dim] == [-1, 2]

    # Requests arriving together (dynamic batching merges them) each get their own rows.
    def one(i: int) -> list[list[float]]:
        r = predict(served.client, tenant, d, {"instances": X[i : i + 2].tolist()})
        assert r.status_code == 200, r.text
        predictions: list[list[float]] = r.json()["predictions"]
        return predictions

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, got in zip(range(0, 32, 2), pool.map(one, range(0, 32, 2)), strict=True):
            np.testing.assert_allclose(got, expected[i : i + 2], rtol=0, atol=1e-6)

    # The model's own refusals, as for a SavedModel: a wrong shape is the caller's error.
    wrong = predict(served.client, tenant, d, {"instances": [[1.0, 2.0, 3.0]]})
    assert wrong.status_code == 400, wrong.text
    assert "x" in wrong.json()["detail"]
    error = refusal(
        served.stub.Predict,
        request(d, "serving_default", x=np.zeros((2, 3), np.float32)),
        metadata=auth(tenant),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            "custom_domain",
            "the model uses the operator Leak of the custom domain 'com.example.ops'",
        ),
        ("external_outside", "keeps tensor data in '../../secret.bin', outside its directory"),
    ],
)
def test_a_model_the_platform_cannot_serve_is_refused_naming_why(
    served: Grpc, onnx_dirs: dict[str, Path], model: str, reason: str
) -> None:
    tenant = create_tenant(served.client, "acme")
    body = deploy(served.client, tenant, served.platform, onnx_dirs[model])
    assert body["status"] == "FAILED", body
    assert reason in body["status_message"]
    assert not body["signatures"]
    # Refused before it was loaded: no process serves it.
    assert served.client.app.state.scoring.cache.cached(body["id"]) is None  # type: ignore[attr-defined]
    r = predict(served.client, tenant, body["id"], {"instances": [[1.0, 2.0]]})
    assert r.status_code == 409
