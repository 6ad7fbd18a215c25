"""TensorFlow Serving's clients, unchanged, against deployed models: its gRPC stubs
(`tensorflow-serving-api`: PredictionService's Predict, Classify, Regress,
MultiInference, GetModelMetadata; ModelService's GetModelStatus) with an `authorization`
metadata entry, and its REST API (`/v1/models/...`) over plain HTTP.

`tensorflow_model_server` cannot be installed here (no wheel on PyPI, no Debian package),
so TensorFlow Serving's answers for these models are recorded below as expected documents
and messages, derived from its REST API documentation (api_rest.md), its protos
(model.proto, classification.proto, regression.proto, inference.proto,
get_model_status.proto) and its JSON writer (json_tensor.cc: floats as `%g` or with
max_digits10 digits, `NaN`/`Infinity`, `.0` after whole numbers; http_server.cc: the HTTP
status of each gRPC code). Its numbers are what TensorFlow computes for the same
SavedModel (`run_signature`), and its GetModelMetadata answer is the SavedModel's own
SignatureDefs, read here from saved_model.pb.
"""

from __future__ import annotations

import base64
import json
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
from tests.api.tfs_models import LABELS, build_classifier, build_multi, run_signature
from tests.conftest import create_tenant

tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")
pytest.importorskip("tensorflow_serving.apis", reason="make install")
from google.protobuf import wrappers_pb2  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

__all__ = ["saved_models"]

X = np.array([[1.0, 2.0], [0.5, -1.0], [-2.0, 0.25]], dtype=np.float32)


@pytest.fixture(scope="session")
def tfs_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tfs_models")
    build_multi(tf, root / "multi")
    build_classifier(tf, root / "classifier")
    return {"multi": root / "multi", "classifier": root / "classifier"}


class Served:
    def __init__(self, client: TestClient, platform: Platform, port: int) -> None:
        self.client = client
        self.platform = platform
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    platform = Platform.from_settings(settings.model_copy(update={"scoring_grpc_port": 0}))
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as client:
            port = client.app.state.grpc_port  # type: ignore[attr-defined]
            served = Served(client, platform, port)
            with served.channel:
                yield served
    finally:
        platform.close()


def deploy_named(served: Served, headers: dict[str, str], model: Path, name: str) -> str:
    training_id = completed_training(served.client, headers, served.platform, model)
    r = served.client.post(
        "/v1/deployments", json={"training_id": training_id, "name": name}, headers=headers
    )
    assert r.status_code == 202, r.text
    body = wait_for(served.client, headers, r.json()["id"])
    assert body["status"] == "READY", body
    deployment_id: str = body["id"]
    return deployment_id


def metadata(headers: dict[str, str]) -> list[tuple[str, str]]:
    """The one change a TensorFlow Serving client needs: its key."""
    return [("authorization", headers["Authorization"])]


def refusal(call: Any, request: Any, headers: dict[str, str]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, metadata=metadata(headers), timeout=60)
    error: grpc.RpcError = info.value
    return error


def spec(name: str, signature: str = "", version: int | None = None) -> model_pb2.ModelSpec:
    s = model_pb2.ModelSpec(name=name, signature_name=signature)
    if version is not None:
        s.version.CopyFrom(wrappers_pb2.Int64Value(value=version))
    return s


def example(x: list[float], **more: float) -> Any:
    features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x))}
    for key, value in more.items():
        features[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=features))


def serialized(*examples: Any) -> np.ndarray:
    return np.array([e.SerializeToString() for e in examples], dtype=object)


def signature_defs(path: Path) -> get_model_metadata_pb2.SignatureDefMap:
    """What TensorFlow Serving's GetModelMetadata answers: the SavedModel's SignatureDefs.
    One is left out: `__saved_model_init_op`, the entry tf.saved_model.save writes for
    its initializer (no inputs, no method), which TensorFlow Serving lists and the
    platform does not (it is no signature a client can call)."""
    proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    defs = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in proto.meta_graphs[0].signature_def.items():
        if name != "__saved_model_init_op":
            defs.signature_def[name].CopyFrom(signature)
    return defs


def model_status(version: int) -> get_model_status_pb2.GetModelStatusResponse:
    answer = get_model_status_pb2.GetModelStatusResponse()
    status = answer.model_version_status.add()
    status.version = version
    status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
    status.status.SetInParent()  # error_code OK, no message: set, as the REST form shows
    return answer


def test_tensorflow_serving_grpc_clients_get_its_answers(
    served: Served, saved_models: dict[str, Path], tfs_models: dict[str, Path]
) -> None:
    tenant = create_tenant(served.client, "acme")
    linear = deploy_named(served, tenant, saved_models["linear"], "linear")
    multi = deploy_named(served, tenant, tfs_models["multi"], "half_plus_two")
    classifier = deploy_named(served, tenant, tfs_models["classifier"], "animals")
    stub, auth = served.predictions, metadata(tenant)

    # Predict by name and by id, version 1 or the default: the response names the spec.
    for name, version in (("linear", None), (linear, 1)):
        request = predict_pb2.PredictRequest(model_spec=spec(name, "serving_default", version))
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(X))
        answer = stub.Predict(request, metadata=auth, timeout=60)
        expected = predict_pb2.PredictResponse(model_spec=spec(name, "serving_default", 1))
        y = run_signature(tf, saved_models["linear"], "serving_default", x=X)["y"]
        expected.outputs["y"].CopyFrom(tf.make_tensor_proto(y))
        assert tf.make_ndarray(answer.outputs["y"]).tolist() == y.tolist()
        assert answer.model_spec == expected.model_spec

    # GetModelMetadata: the SavedModel's SignatureDefs, tensor names included.
    for name, path in (("linear", saved_models["linear"]), ("half_plus_two", tfs_models["multi"])):
        ask = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec(name), metadata_field=["signature_def"]
        )
        answer = stub.GetModelMetadata(ask, metadata=auth, timeout=60)
        assert answer.model_spec == spec(name, version=1)
        defs = get_model_metadata_pb2.SignatureDefMap()
        assert answer.metadata["signature_def"].Unpack(defs)
        assert defs == signature_defs(path)
    assert defs.signature_def["serving_default"].inputs["x"].name == "x:0"

    # GetModelStatus (ModelService).
    for version in (None, 1):
        ask_status = get_model_status_pb2.GetModelStatusRequest(
            model_spec=spec(multi, version=version)
        )
        answer = served.models.GetModelStatus(ask_status, metadata=auth, timeout=60)
        assert answer == model_status(1)

    # Classify: a classifier with tf.Example input (classes and scores), with a context.
    first, second = example([1.0, 2.0]), example([-1.0, 0.5], bias=2.0)
    request_c = classification_pb2.ClassificationRequest(model_spec=spec("animals"))
    request_c.input.example_list_with_context.examples.extend([first, example([-1.0, 0.5])])
    request_c.input.example_list_with_context.context.CopyFrom(example([9.0, 9.0], bias=2.0))
    answer_c = stub.Classify(request_c, metadata=auth, timeout=60)
    computed = run_signature(
        tf,
        tfs_models["classifier"],
        "serving_default",
        inputs=serialized(example([1.0, 2.0], bias=2.0), second),
    )
    expected_c = classification_pb2.ClassificationResponse(
        model_spec=spec("animals", "serving_default", 1)
    )
    for labels, scores in zip(computed["classes"], computed["scores"], strict=True):
        entry = expected_c.result.classifications.add()
        for label, score in zip(labels, scores, strict=True):
            entry.classes.add(label=label.decode(), score=score)
    assert [c.label for c in expected_c.result.classifications[0].classes] == ["cat", "dog", "owl"]
    assert answer_c == expected_c

    # Regress and MultiInference on the multi-signature model.
    examples = [example(row.tolist()) for row in X]
    request_r = regression_pb2.RegressionRequest(model_spec=spec(multi, "regress_x_to_y", 1))
    request_r.input.example_list.examples.extend(examples)
    answer_r = stub.Regress(request_r, metadata=auth, timeout=60)
    regressed = run_signature(
        tf, tfs_models["multi"], "regress_x_to_y", inputs=serialized(*examples)
    )
    expected_r = regression_pb2.RegressionResponse(model_spec=spec(multi, "regress_x_to_y", 1))
    for value in regressed["outputs"]:
        expected_r.result.regressions.add(value=value)
    assert answer_r == expected_r

    request_m = inference_pb2.MultiInferenceRequest()
    request_m.tasks.add(
        model_spec=spec(multi, "classify_x_to_y"), method_name="tensorflow/serving/classify"
    )
    request_m.tasks.add(
        model_spec=spec(multi, "regress_x_to_y"), method_name="tensorflow/serving/regress"
    )
    request_m.input.example_list.examples.extend(examples)
    answer_m = stub.MultiInference(request_m, metadata=auth, timeout=60)
    scored = run_signature(tf, tfs_models["multi"], "classify_x_to_y", inputs=serialized(*examples))
    expected_m = inference_pb2.MultiInferenceResponse()
    first_result = expected_m.results.add(model_spec=spec(multi, "classify_x_to_y", 1))
    for scores in scored["scores"]:
        first_result.classification_result.classifications.add().classes.add(score=scores[0])
    second_result = expected_m.results.add(model_spec=spec(multi, "regress_x_to_y", 1))
    second_result.regression_result.CopyFrom(expected_r.result)
    assert answer_m == expected_m

    # The error cases, with TensorFlow Serving's codes.
    def predict(name: str, signature: str = "", version: int | None = None, x: Any = X) -> Any:
        r = predict_pb2.PredictRequest(model_spec=spec(name, signature, version))
        r.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
        return r

    cases = [
        (stub.Predict, predict("nosuch"), grpc.StatusCode.NOT_FOUND),
        (stub.Predict, predict(linear, version=7), grpc.StatusCode.NOT_FOUND),
        (stub.Predict, predict(linear, "nope"), grpc.StatusCode.FAILED_PRECONDITION),
        (stub.Predict, predict(linear, x=X.astype(np.int64)), grpc.StatusCode.INVALID_ARGUMENT),
        (stub.Predict, predict(linear, x=X[:, :1]), grpc.StatusCode.INVALID_ARGUMENT),
        (
            stub.Classify,
            classification_pb2.ClassificationRequest(model_spec=spec(multi, "nope")),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (
            stub.Regress,
            regression_pb2.RegressionRequest(model_spec=spec(classifier, version=2)),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            served.models.GetModelStatus,
            get_model_status_pb2.GetModelStatusRequest(model_spec=spec(multi, version=3)),
            grpc.StatusCode.NOT_FOUND,
        ),
    ]
    for call, request, code in cases:
        error = refusal(call, request, tenant)
        assert error.code() == code, (request, error.details())
    error = refusal(stub.Predict, predict(linear, version=7), tenant)
    assert error.details() == f"Servable not found for request: Specific({linear}, 7)"
    labelled = predict(linear)
    labelled.model_spec.version_label = "canary"
    assert refusal(stub.Predict, labelled, tenant).code() == grpc.StatusCode.NOT_FOUND
    # A Classify on a Regress signature, and one without examples.
    wrong = classification_pb2.ClassificationRequest(model_spec=spec(multi, "regress_x_to_y"))
    wrong.input.example_list.examples.extend(examples)
    error = refusal(stub.Classify, wrong, tenant)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expected classification signature method_name" in error.details()
    empty = classification_pb2.ClassificationRequest(model_spec=spec(classifier))
    assert refusal(stub.Classify, empty, tenant).code() == grpc.StatusCode.INVALID_ARGUMENT
    # Another tenant's model is as absent as a missing one.
    rival = create_tenant(served.client, "rival")
    assert refusal(stub.Predict, predict(linear), rival).code() == grpc.StatusCode.NOT_FOUND
    assert refusal(stub.Predict, predict("linear"), rival).code() == grpc.StatusCode.NOT_FOUND


# TensorFlow Serving's REST answers for the `multi` model (as api_rest.md shows them, with
# the tensor names of this SavedModel).
def multi_metadata(name: str) -> dict[str, Any]:
    def tensor(dtype: str, dims: list[int], tensor_name: str) -> dict[str, Any]:
        return {
            "dtype": dtype,
            "tensor_shape": {
                "dim": [{"size": str(d), "name": ""} for d in dims],
                "unknown_rank": False,
            },
            "name": tensor_name,
        }

    examples = {"inputs": tensor("DT_STRING", [-1], "tf_example:0")}
    return {
        "model_spec": {"name": name, "signature_name": "", "version": "1"},
        "metadata": {
            "signature_def": {
                "signature_def": {
                    "classify_x_to_y": {
                        "inputs": examples,
                        "outputs": {"scores": tensor("DT_FLOAT", [-1, 1], "score:0")},
                        "method_name": "tensorflow/serving/classify",
                        "defaults": {},
                    },
                    "regress_x_to_y": {
                        "inputs": examples,
                        "outputs": {"outputs": tensor("DT_FLOAT", [-1], "y_regress:0")},
                        "method_name": "tensorflow/serving/regress",
                        "defaults": {},
                    },
                    "serving_default": {
                        "inputs": {"x": tensor("DT_FLOAT", [-1, 2], "x:0")},
                        "outputs": {"y": tensor("DT_FLOAT", [-1, 1], "y:0")},
                        "method_name": "tensorflow/serving/predict",
                        "defaults": {},
                    },
                }
            }
        },
    }


def written(value: float) -> float:
    """A float32 as TensorFlow Serving's JSON holds it (json_tensor.cc's WriteDecimal: six
    significant digits, or nine where six do not read back as the same float32), read
    back by a JSON parser."""
    short = float(f"{value:g}")
    return short if np.float32(short) == np.float32(value) else float(f"{value:.9g}")


AVAILABLE = {
    "model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]
}


def test_tensorflow_serving_rest_paths_answer_its_documents(
    served: Served, tfs_models: dict[str, Path]
) -> None:
    client = served.client
    tenant = create_tenant(client, "acme")
    multi = deploy_named(served, tenant, tfs_models["multi"], "half_plus_two")
    deploy_named(served, tenant, tfs_models["classifier"], "animals")

    def get(path: str, headers: dict[str, str] = tenant) -> Any:
        return client.get(path, headers=headers)

    def post(path: str, body: Any, headers: dict[str, str] = tenant) -> Any:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return client.post(path, content=content, headers=headers)

    # Model status and metadata, by name or id, with or without the version.
    for path in ("/v1/models/half_plus_two", f"/v1/models/{multi}/versions/1"):
        r = get(path)
        assert r.status_code == 200, r.text
        assert r.json() == AVAILABLE
    r = get("/v1/models/half_plus_two/metadata")
    assert r.status_code == 200, r.text
    assert r.json() == multi_metadata("half_plus_two")
    assert get(f"/v1/models/{multi}/versions/1/metadata").json() == multi_metadata(multi)

    # :predict, row and columnar, with NaN and infinities in and out.
    r = post("/v1/models/half_plus_two:predict", {"instances": [[1.0, 2.0], [0.5, -1.0]]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [[-0.5], [4.0]]}
    assert r.headers["content-type"] == "application/json"
    r = post(
        "/v1/models/half_plus_two/versions/1:predict",
        b'{"signature_name": "serving_default", "inputs": [[NaN, 1.0], [Infinity, 0.0], '
        b"[-Infinity, 0.0], [1234567.0, 0.0], [0.5, 0]]}",
    )
    assert r.status_code == 200, r.text
    # Floats as TensorFlow Serving writes them: %g unless that loses the value (then 9
    # digits for a float32), ".0" after a whole number.
    assert r.text.replace(" ", "").replace("\n", "") == (
        '{"outputs":[[NaN],[Infinity],[-Infinity],[3703701.5],[2.0]]}'
    )
    parsed = json.loads(r.text)["outputs"]
    assert np.isnan(parsed[0][0]) and parsed[1][0] == float("inf") and parsed[2][0] == -float("inf")

    # b64 strings: serialized tf.Examples into the classifier's signature, by :predict,
    # whose two outputs make each prediction an object.
    examples = [example([1.0, 2.0]), example([0.0, -1.0], bias=1.0)]
    b64 = [{"b64": base64.b64encode(e.SerializeToString()).decode()} for e in examples]
    r = post("/v1/models/animals:predict", {"instances": b64})
    assert r.status_code == 200, r.text
    computed = run_signature(
        tf, tfs_models["classifier"], "serving_default", inputs=serialized(*examples)
    )
    assert r.json() == {
        "predictions": [
            {"classes": [c.decode() for c in classes], "scores": [written(v) for v in scores]}
            for classes, scores in zip(computed["classes"], computed["scores"], strict=True)
        ]
    }
    assert [c.encode() for c in r.json()["predictions"][0]["classes"]] == LABELS

    # :classify and :regress with tf.Examples in JSON (and a context).
    r = post(
        "/v1/models/animals:classify",
        {
            "context": {"bias": 1.0},
            "examples": [{"x": [1.0, 2.0]}, {"x": [0.0, -1.0], "bias": 0.5}],
        },
    )
    assert r.status_code == 200, r.text
    computed = run_signature(
        tf,
        tfs_models["classifier"],
        "serving_default",
        inputs=serialized(example([1.0, 2.0], bias=1.0), example([0.0, -1.0], bias=0.5)),
    )
    assert r.json() == {
        "results": [
            [[label.decode(), written(score)] for label, score in zip(labels, scores, strict=True)]
            for labels, scores in zip(computed["classes"], computed["scores"], strict=True)
        ]
    }
    r = post(
        f"/v1/models/{multi}:regress",
        {"signature_name": "regress_x_to_y", "examples": [{"x": [1.0, 2.0]}, {"x": [3.0, 1.0]}]},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [-0.5, 7.5]}
    r = post(
        "/v1/models/half_plus_two:classify",
        {"signature_name": "classify_x_to_y", "examples": [{"x": [0.0, 0.25]}]},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [[["", pytest.approx(0.5, abs=1e-7)]]]}

    # Refusals: {"error": ...} with TensorFlow Serving's status codes.
    rival = create_tenant(client, "rival")
    cases = [
        (post("/v1/models/half_plus_two:predict", {"instances": [[1.0, 2.0, 3.0]]}), 400),
        (post("/v1/models/half_plus_two:predict", {"instances": [["a", "b"]]}), 400),
        (
            post(
                "/v1/models/half_plus_two:predict",
                {"signature_name": "nope", "instances": [[1.0, 2.0]]},
            ),
            400,
        ),
        (post("/v1/models/half_plus_two:predict", b"{not json"), 400),
        (post("/v1/models/half_plus_two:predict", {"rows": []}), 400),
        (post("/v1/models/half_plus_two:classify", {"examples": [{"x": [1.0, 2.0]}]}), 400),
        (post("/v1/models/animals:classify", {"examples": [{"x": [1.0, "a"]}]}), 400),
        # Whole numbers are an int64 feature, which the model parses as float: refused.
        (post("/v1/models/animals:classify", {"examples": [{"x": [3, 1]}]}), 400),
        (post("/v1/models/nosuch:predict", {"instances": [[1.0, 2.0]]}), 404),
        (post("/v1/models/half_plus_two/versions/2:predict", {"instances": [[1.0, 2.0]]}), 404),
        (post("/v1/models/half_plus_two/labels/canary:predict", {"instances": [[1.0, 2.0]]}), 404),
        (post("/v1/models/half_plus_two:predict", {"instances": [[1.0, 2.0]]}, rival), 404),
        (post("/v1/models/half_plus_two:predict", {"instances": [[1.0, 2.0]]}, {}), 401),
        (post("/v1/models/half_plus_two:explain", {"instances": [[1.0, 2.0]]}), 400),
        (get("/v1/models/half_plus_two/versions/7"), 404),
        (get("/v1/models/half_plus_two/labels/stable/metadata"), 404),
        (get("/v1/models/nosuch", rival), 404),
    ]
    for r, status in cases:
        assert r.status_code == status, (r.request.url, r.text)
        assert set(r.json()) == {"error"}, r.text
        assert r.headers["content-type"] == "application/json"
    r = get("/v1/models/half_plus_two/versions/7")
    assert r.json() == {"error": f"Servable not found for request: Specific({multi}, 7)"}
    # The platform's own route keeps problem+json.
    r = post(f"/v1/deployments/{multi}/predictions", {"instances": [[1.0, 2.0, 3.0]]})
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/problem+json"


def test_the_api_forwards_tensorflow_servings_paths_to_the_scoring_service(
    settings: Settings,
) -> None:
    """With DLAAS_SCORING_URL the API forwards /v1/models/... as it forwards predictions;
    a scoring service it cannot reach is TensorFlow Serving's 503 `{"error"}`."""
    platform = Platform.from_settings(
        settings.model_copy(update={"scoring_url": "http://127.0.0.1:9"})
    )
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as client:
            tenant = create_tenant(client, "acme")
            for r in (
                client.post("/v1/models/m:predict", json={"instances": [[1.0]]}, headers=tenant),
                client.get("/v1/models/m/versions/1/metadata", headers=tenant),
            ):
                assert r.status_code == 503, r.text
                unreachable = "the scoring service at http://127.0.0.1:9 did not answer"
                assert r.json() == {"error": f"{unreachable} (ConnectError)"}
            r = client.get("/v1/models/m", headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401 and set(r.json()) == {"error"}
    finally:
        platform.close()


def test_model_status_follows_the_deployment(served: Served) -> None:
    """A deployment still loading is LOADING; one that failed to load is END with the
    reason; over REST and gRPC alike."""
    from service.db.models import Deployment, Training

    tenant = create_tenant(served.client, "acme")
    training_id = completed_training(served.client, tenant, served.platform, None)
    with served.platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        for deployment_id, status, message in (
            ("loading1", "DEPLOYING", "loading the model"),
            ("failed1", "FAILED", "the SavedModel has no 'serving_default' signature"),
        ):
            session.add(
                Deployment(
                    id=deployment_id,
                    tenant_id=training.tenant_id,
                    training_id=training_id,
                    name=f"{deployment_id}-name",
                    status=status,
                    status_message=message,
                    model_key=f"deployments/{deployment_id}/model/",
                )
            )
        session.commit()
    expected = {
        "loading1-name": ("LOADING", "OK", ""),
        "failed1": ("END", "UNKNOWN", "the SavedModel has no 'serving_default' signature"),
    }
    for name, (state, code, message) in expected.items():
        r = served.client.get(f"/v1/models/{name}", headers=tenant)
        assert r.status_code == 200, r.text
        assert r.json() == {
            "model_version_status": [
                {
                    "version": "1",
                    "state": state,
                    "status": {"error_code": code, "error_message": message},
                }
            ]
        }
        answer = served.models.GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec=spec(name)),
            metadata=metadata(tenant),
            timeout=60,
        )
        status = answer.model_version_status[0]
        assert get_model_status_pb2.ModelVersionStatus.State.Name(status.state) == state
        assert status.status.error_message == message
    # Predictions and metadata still need the model READY (TensorFlow Serving: no servable).
    r = served.client.post(
        "/v1/models/loading1:predict", json={"instances": [[1.0]]}, headers=tenant
    )
    assert r.status_code == 400 and "DEPLOYING" in r.json()["error"]
