"""TensorFlow Serving's gRPC API (DLAAS_SCORING_GRPC_PORT): an unmodified TensorFlow Serving
client (`PredictionServiceStub`, `PredictRequest`) gets the REST endpoint's numbers, and
the REST refusals arrive as gRPC status codes with the problem's detail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.db.models import Deployment, Training
from service.platform import Platform
from service.settings import Settings
from tests.api.test_deployments import deploy, predict, saved_models
from tests.conftest import create_tenant

tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")
serving = pytest.importorskip("tensorflow_serving.apis", reason="make install")
from tensorflow_serving.apis import (  # noqa: E402
    get_model_metadata_pb2,
    model_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

__all__ = ["saved_models"]  # the fixture, shared with test_deployments

X = np.random.default_rng(3).uniform(-1, 1, size=(5, 2)).astype(np.float32)


class Grpc:
    """The app with scoring and its gRPC port, and a TensorFlow Serving client of it."""

    def __init__(self, client: TestClient, platform: Platform, port: int) -> None:
        self.client = client
        self.platform = platform
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)


@pytest.fixture
def served(settings: Settings, grpc_front: str) -> Iterator[Grpc]:
    update = {"scoring_grpc_port": 0, "scoring_grpc_front": grpc_front}
    platform = Platform.from_settings(settings.model_copy(update=update))
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as client:
            grpc_api = Grpc(client, platform, client.app.state.grpc_port)  # type: ignore[attr-defined]
            with grpc_api.channel:
                yield grpc_api
    finally:
        platform.close()


def auth(headers: dict[str, str]) -> list[tuple[str, str]]:
    return [("authorization", headers["Authorization"])]


def request(deployment_id: str, signature: str = "", **inputs: Any) -> Any:
    r = predict_pb2.PredictRequest(
        model_spec=model_pb2.ModelSpec(name=deployment_id, signature_name=signature)
    )
    for name, value in inputs.items():
        r.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return r


def refusal(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    error: grpc.RpcError = info.value
    return error


def test_a_tensorflow_serving_client_gets_the_rest_predictions(
    served: Grpc, saved_models: dict[str, Path], one_rate_window: None
) -> None:
    tenant = create_tenant(served.client, "acme")
    deployment = deploy(served.client, tenant, served.platform, saved_models["linear"])
    assert deployment["status"] == "READY", deployment
    d = deployment["id"]

    rest = predict(served.client, tenant, d, {"instances": X.tolist()})
    assert rest.status_code == 200, rest.text
    answer, call = served.stub.Predict.with_call(
        request(d, "serving_default", x=X), metadata=auth(tenant), timeout=30
    )
    y = tf.make_ndarray(answer.outputs["y"])
    assert y.dtype == np.float32 and y.shape == (5, 1)
    np.testing.assert_allclose(y, np.asarray(rest.json()["predictions"]), rtol=0, atol=1e-6)
    assert answer.model_spec.name == d
    assert answer.model_spec.signature_name == "serving_default"
    trailing = dict(call.trailing_metadata())
    assert int(trailing["x-ratelimit-remaining"]) == int(trailing["x-ratelimit-limit"]) - 10

    # The default signature, and values in the typed field rather than tensor_content.
    typed = request(d)
    typed.inputs["x"].CopyFrom(
        tf.make_tensor_proto(X[:2].ravel().tolist(), dtype=tf.float32, shape=[2, 2])
    )
    typed.inputs["x"].ClearField("tensor_content")
    typed.inputs["x"].float_val.extend(X[:2].ravel().tolist())
    y2 = tf.make_ndarray(served.stub.Predict(typed, metadata=auth(tenant)).outputs["y"])
    np.testing.assert_allclose(y2, y[:2], rtol=0, atol=1e-6)

    # A signature with two inputs and two outputs, and an output_filter.
    a, b = np.array([[1, 1], [0, 1]], np.float32), np.array([2, 5], np.int64)
    rest = predict(
        served.client,
        tenant,
        d,
        {"signature_name": "two", "inputs": {"a": a.tolist(), "b": b.tolist()}},
    )
    answer = served.stub.Predict(request(d, "two", a=a, b=b), metadata=auth(tenant))
    assert set(answer.outputs) == {"y", "z"}
    for name in ("y", "z"):
        np.testing.assert_allclose(
            tf.make_ndarray(answer.outputs[name]), rest.json()["outputs"][name], rtol=0, atol=1e-6
        )
    only = request(d, "two", a=a, b=b)
    only.output_filter.append("z")
    assert set(served.stub.Predict(only, metadata=auth(tenant)).outputs) == {"z"}


def test_get_model_metadata_returns_the_signature_def_map(
    served: Grpc, saved_models: dict[str, Path]
) -> None:
    tenant = create_tenant(served.client, "acme")
    d = deploy(served.client, tenant, served.platform, saved_models["linear"])["id"]
    ask = get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec=model_pb2.ModelSpec(name=d), metadata_field=["signature_def"]
    )
    answer = served.stub.GetModelMetadata(ask, metadata=auth(tenant))
    assert answer.model_spec.name == d
    defs = get_model_metadata_pb2.SignatureDefMap()
    assert answer.metadata["signature_def"].Unpack(defs)
    assert set(defs.signature_def) == {"serving_default", "two"}
    serve = defs.signature_def["serving_default"]
    assert serve.method_name == "tensorflow/serving/predict"
    assert serve.inputs["x"].dtype == tf.float32.as_datatype_enum
    assert [dim.size for dim in serve.inputs["x"].tensor_shape.dim] == [-1, 2]
    assert [dim.size for dim in serve.outputs["y"].tensor_shape.dim] == [-1, 1]
    assert defs.signature_def["two"].inputs["b"].dtype == tf.int64.as_datatype_enum

    nobody = [("authorization", "Bearer nope")]
    error = refusal(served.stub.GetModelMetadata, ask, metadata=nobody)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    ask.metadata_field[:] = ["graph"]
    error = refusal(served.stub.GetModelMetadata, ask, metadata=auth(tenant))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "signature_def" in error.details()


def test_refusals_are_grpc_status_codes_with_the_problems_detail(
    served: Grpc, saved_models: dict[str, Path], one_rate_window: None
) -> None:
    client = served.client
    tenant = create_tenant(client, "acme")
    deployment = deploy(client, tenant, served.platform, saved_models["linear"])
    d = deployment["id"]
    ok = request(d, x=X)

    error = refusal(served.stub.Predict, ok)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Authorization: Bearer" in error.details()
    bad_key = [("authorization", "Bearer nope")]
    error = refusal(served.stub.Predict, ok, metadata=bad_key)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == "the API key is not valid"

    for deployment_id, headers in ((d, create_tenant(client, "rival")), ("nosuch", tenant)):
        rest = predict(client, headers, deployment_id, {"instances": X.tolist()})
        assert rest.status_code == 404
        error = refusal(served.stub.Predict, request(deployment_id, x=X), metadata=auth(headers))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error.details() == rest.json()["detail"]

    # Not READY: 409 over REST.
    with served.platform.sessions() as session:
        training = session.get(Training, deployment["training_id"])
        assert training is not None
        session.add(
            Deployment(
                id="deploying1",
                tenant_id=training.tenant_id,
                training_id=training.id,
                name="d",
                status="DEPLOYING",
                model_key="deployments/deploying1/model/",
            )
        )
        session.commit()
    error = refusal(served.stub.Predict, request("deploying1", x=X), metadata=auth(tenant))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "answers" in error.details()

    # The plan's rate limit, counted as for REST: lite allows 500 predictions a minute.
    lite = create_tenant(client, "small", "lite")
    d_lite = deploy(client, lite, served.platform, saved_models["linear"])["id"]
    batch = np.zeros((300, 2), np.float32)
    served.stub.Predict(request(d_lite, x=batch), metadata=auth(lite))
    error = refusal(served.stub.Predict, request(d_lite, x=batch), metadata=auth(lite))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "500 predictions a minute" in error.details()
    assert 1 <= int(dict(error.trailing_metadata())["retry-after"]) <= 60
    rest = predict(client, lite, d_lite, {"instances": batch.tolist()})
    assert rest.status_code == 429  # the same window
    served.stub.Predict(request(d_lite, x=batch[:200]), metadata=auth(lite))

    # Payloads that do not fit the signature name the field, as REST does.
    cases = [
        (request(d, x=X.astype(np.float64)), "/inputs/x: is a DT_DOUBLE tensor"),
        (request(d, x=X[:, :1]), "/inputs/x: has shape [5, 1]; x expects float32 [None, 2]"),
        (request(d, x=X, w=X), "/inputs/w: is not an input of signature 'serving_default'"),
        (request(d), "/inputs/x: is required"),
    ]
    for bad, detail in cases:
        error = refusal(served.stub.Predict, bad, metadata=auth(tenant))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details().startswith(detail), error.details()
    # An unknown signature is FAILED_PRECONDITION, TensorFlow Serving's code.
    error = refusal(served.stub.Predict, request(d, "nope", x=X), metadata=auth(tenant))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert error.details().startswith("/signature_name: the model has no signature 'nope'")
    short = request(d, x=X)
    short.inputs["x"].tensor_content = short.inputs["x"].tensor_content[:-4]
    error = refusal(served.stub.Predict, short, metadata=auth(tenant))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor_content has 36 bytes for 10 float32 values" in error.details()
    garbage = served.channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    error = refusal(garbage, b"\xff\xff\xff", metadata=auth(tenant))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("body: is not a PredictRequest")


def test_a_database_that_cannot_serve_is_unavailable(
    served: Grpc, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    import service.scoring.service as scoring_service

    def down(*args: object, **kwargs: object) -> object:
        raise OperationalError("SELECT", {}, Exception("the database system is shutting down"))

    tenant = create_tenant(served.client, "acme")
    monkeypatch.setattr(scoring_service, "scoring_target", down)
    error = refusal(served.stub.Predict, request("d1", x=X), metadata=auth(tenant))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "the database is unavailable" in error.details()
    assert dict(error.trailing_metadata())["retry-after"] == "5"
