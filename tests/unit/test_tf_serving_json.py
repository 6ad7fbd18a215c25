"""TensorFlow Serving's REST translation, without a server: bodies with NaN and
infinities, floats written as its json_tensor writes them (and the array path agreeing
with the value-by-value one), tf.Example JSON, the Classify and Regress signatures'
checks, the version of a request, and the status codes of refusals."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest

from service.domain.deployments import ScoringTarget
from service.domain.signature import (
    CLASSIFY_METHOD,
    PREDICT_METHOD,
    REGRESS_METHOD,
    SignatureInfo,
    TensorInfo,
)
from service.errors import Conflict, NotFound, TooManyRequests, Unauthorized, UnknownVersion
from service.http.serving_errors import HTTP_STATUS, serving_code
from service.scoring import tfs_json
from service.scoring.arrays import InvalidPayload, UnknownSignature
from service.scoring.tf_example import example_from_json, examples_from_request
from service.scoring.tfs_infer import classifications, inference_signature, regressions
from service.scoring.tfs_protos import serving_messages
from service.scoring.versions import resolve_version

EXAMPLE = serving_messages().Example
SERVE = SignatureInfo(
    "serving_default",
    {"x": TensorInfo("x", "float32", (None, 2))},
    {"y": TensorInfo("y", "float32", (None, 1))},
)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (float("-inf"), "-Infinity"),
        (2.0, "2.0"),
        (0.0, "0.0"),
        (-0.5, "-0.5"),
        (0.1, "0.1"),  # float32(0.1) reads back from six digits
        (1e-05, "1e-05"),
        (3703701.5, "3703701.5"),  # %g gives 3.7037e+06, which does not read back
        (1234567.0, "1234567.0"),
        (0.123456791, "0.123456791"),
    ],
)
def test_float32_values_are_written_as_tensorflow_serving_writes_them(
    value: float, written: str
) -> None:
    assert tfs_json._FLOAT32(float(np.float32(value))) == written


def test_the_array_path_writes_the_same_numbers_as_the_value_path() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            rng.uniform(-1, 1, 5000),
            rng.standard_normal(5000) * 10.0 ** rng.integers(-3, 5, 5000),
            [0.0, -0.0, 1.0, 2.5, 0.1, 0.15, 1e5, 999999.7, 99999.95, 12345.675],
        ]
    ).astype(np.float32)
    magnitude = np.abs(values)
    values = values[((magnitude >= 1.001e-4) & (magnitude < 9.99e5)) | (magnitude == 0)]
    fast = tfs_json._fast_float32(values)
    assert fast is not None
    # The same text, not only the same numbers.
    got = orjson.dumps(fast, option=orjson.OPT_SERIALIZE_NUMPY).decode().strip("[]").split(",")
    expected = [tfs_json._FLOAT32(v) for v in values.astype(np.float64).tolist()]
    assert got == expected
    for outside in ([np.nan], [1e7], [1e-6]):
        assert tfs_json._fast_float32(np.array(outside, np.float32)) is None


def test_bodies_take_nan_and_infinities_and_answer_them() -> None:
    payload = tfs_json.load_body(b'{"inputs": [[NaN, 1.0], [Infinity, -Infinity]]}')
    request = tfs_json.predict_request(payload, {"serving_default": SERVE})
    x = request.tensors["x"]
    assert np.isnan(x[0, 0]) and x[1, 0] == np.inf and x[1, 1] == -np.inf
    answer = tfs_json.predict_answer(request, {"y": np.array([[np.nan], [1.5]], np.float32)})
    assert answer.replace(b" ", b"") == b'{"outputs":[[NaN],[1.5]]}'
    rows = tfs_json.predict_request({"instances": [[1, 2]]}, {"serving_default": SERVE})
    assert tfs_json.predict_answer(rows, {"y": np.array([[0.25]], np.float32)}) == (
        b'{"predictions":[[0.25]]}'
    )
    for body in (b"", b"[1]", b"{nope"):
        with pytest.raises(InvalidPayload):
            tfs_json.load_body(body)
    with pytest.raises(InvalidPayload, match="Missing 'inputs' or 'instances' key"):
        tfs_json.predict_request({"rows": []}, {"serving_default": SERVE})
    with pytest.raises(UnknownSignature):
        tfs_json.predict_request({"signature_name": "x", "inputs": []}, {"serving_default": SERVE})


def test_bytes_outputs_and_several_outputs_by_row() -> None:
    signature = SignatureInfo(
        "serving_default",
        {"x": TensorInfo("x", "string", (None,))},
        {
            "out_bytes": TensorInfo("out_bytes", "string", (None,)),
            "text": TensorInfo("text", "string", (None,)),
        },
    )
    request = tfs_json.predict_request(
        {"instances": [{"b64": "AAE="}]}, {"serving_default": signature}
    )
    assert request.tensors["x"].tolist() == [b"\x00\x01"]
    strings = np.array([b"\x00\x01"], dtype=object)
    answer = tfs_json.predict_answer(
        request, {"out_bytes": strings, "text": np.array([b"a"], object)}
    )
    assert json.loads(answer) == {"predictions": [{"out_bytes": {"b64": "AAE="}, "text": "a"}]}


def test_examples_from_json() -> None:
    example = example_from_json(
        {"a": [1.5, 2.0], "b": "text", "c": [1, True], "d": {"b64": "AAE="}, "e": []},
        "/examples/0",
        EXAMPLE,
    )
    features = example.features.feature
    assert list(features["a"].float_list.value) == [1.5, 2.0]
    assert list(features["b"].bytes_list.value) == [b"text"]
    assert list(features["c"].int64_list.value) == [1, 1]
    assert list(features["d"].bytes_list.value) == [b"\x00\x01"]
    assert features["e"].WhichOneof("kind") is None
    bad: list[tuple[Any, str]] = [
        ({"a": [1.0, "x"]}, "expecting type: float"),
        ({"a": None}, "unexpected JSON type: Null"),
        ({"a": [[1.0]]}, "unexpected JSON type: Array"),
        ({"a": 2**64}, "Only int64 is supported"),
        ([1], "Example must be JSON object"),
    ]
    for value, message in bad:
        with pytest.raises(InvalidPayload, match=message):
            example_from_json(value, "/examples/0", EXAMPLE)
    # A context's features reach every example; an example's own feature wins.
    serialized = examples_from_request(
        {"context": {"k": 1.0, "x": 9.0}, "examples": [{"x": 1.0}, {}]}, EXAMPLE
    )
    merged = [EXAMPLE.FromString(s).features.feature for s in serialized]
    assert merged[0]["x"].float_list.value == [1.0] and merged[0]["k"].float_list.value == [1.0]
    assert merged[1]["x"].float_list.value == [9.0]
    for payload in ({}, {"examples": []}, {"examples": {}}):
        with pytest.raises(InvalidPayload):
            examples_from_request(payload, EXAMPLE)


def test_classify_and_regress_signatures() -> None:
    examples = {"inputs": TensorInfo("inputs", "string", (None,))}
    classify = SignatureInfo(
        "c",
        examples,
        {
            "classes": TensorInfo("classes", "string", (None, 2)),
            "scores": TensorInfo("scores", "float32", (None, 2)),
        },
        CLASSIFY_METHOD,
    )
    regress = SignatureInfo(
        "r", examples, {"outputs": TensorInfo("outputs", "float32", (None, 1))}, REGRESS_METHOD
    )
    signatures = {"c": classify, "r": regress, "serving_default": SERVE}
    assert inference_signature(signatures, "c", CLASSIFY_METHOD) is classify
    with pytest.raises(InvalidPayload, match="Expected classification signature method_name"):
        inference_signature(signatures, "r", CLASSIFY_METHOD)
    with pytest.raises(InvalidPayload, match=f"Was: {PREDICT_METHOD}"):
        inference_signature(signatures, "", REGRESS_METHOD)
    with pytest.raises(UnknownSignature):
        inference_signature(signatures, "nope", REGRESS_METHOD)
    found = classifications(
        classify,
        {
            "classes": np.array([[b"a", b"b"]], dtype=object),
            "scores": np.array([[0.25, 0.75]], np.float32),
        },
        1,
    )
    assert [(c.label, c.score) for c in found[0]] == [(b"a", 0.25), (b"b", 0.75)]
    with pytest.raises(InvalidPayload, match=r"\[batch_size num_classes\]"):
        classifications(classify, {"scores": np.array([0.5], np.float32)}, 1)
    assert regressions(regress, {"outputs": np.array([[1.5], [2.0]], np.float32)}, 2) == [1.5, 2.0]
    with pytest.raises(InvalidPayload, match=r"\[batch_size\] or \[batch_size, 1\]"):
        regressions(regress, {"outputs": np.zeros((2, 2), np.float32)}, 2)


def test_a_deployment_has_version_1_only() -> None:
    target = ScoringTarget("d1", "k", {})
    assert resolve_version(target, None, None) == 1
    assert resolve_version(target, 1, None) == 1
    with pytest.raises(UnknownVersion, match=r"Servable not found for request: Specific\(d1, 7\)"):
        resolve_version(target, 7, None)
    with pytest.raises(UnknownVersion):
        resolve_version(target, None, "stable")


@pytest.mark.parametrize(
    ("error", "code", "http"),
    [
        (UnknownSignature("/signature_name", "no"), "FAILED_PRECONDITION", 400),
        (InvalidPayload("/inputs/x", "shape"), "INVALID_ARGUMENT", 400),
        (UnknownVersion("v"), "NOT_FOUND", 404),
        (NotFound("m"), "NOT_FOUND", 404),
        (Conflict("not READY"), "FAILED_PRECONDITION", 400),
        (Unauthorized("key"), "UNAUTHENTICATED", 401),
        (TooManyRequests("rate", retry_after=3), "RESOURCE_EXHAUSTED", 429),
    ],
)
def test_refusals_have_tensorflow_servings_codes(error: Any, code: str, http: int) -> None:
    assert serving_code(error) == code
    assert HTTP_STATUS[code] == http
