"""Prediction payloads: TensorFlow Serving's row and columnar forms and WML's values, checked
against signatures and turned into numpy arrays; answers shaped back. Pure tables."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from service.domain.signature import SignatureInfo, TensorInfo
from service.scoring.inputs import (
    InvalidPayload,
    PayloadForm,
    decode_body,
    encode_answer,
    parse_request,
    render,
)


def sig(name: str, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> SignatureInfo:
    return SignatureInfo(name, {t.name: t for t in inputs}, {t.name: t for t in outputs})


SIGNATURES = {
    "serving_default": sig(
        "serving_default",
        [TensorInfo("x", "float32", (None, 2))],
        [TensorInfo("y", "float32", (None, 1))],
    ),
    "two": sig(
        "two",
        [TensorInfo("a", "float32", (None, 2)), TensorInfo("b", "int64", (None,))],
        [TensorInfo("y", "float32", (None, 1)), TensorInfo("z", "float32", (None,))],
    ),
    "text": sig("text", [TensorInfo("s", "string", (None,))], [TensorInfo("n", "int32", (None,))]),
    "scalar": sig("scalar", [TensorInfo("c", "float32", ())], [TensorInfo("d", "float32", ())]),
    "small": sig("small", [TensorInfo("i", "int8", (None,))], [TensorInfo("o", "int8", (None,))]),
}


def parse(payload: Any) -> Any:
    return parse_request(decode_body(json.dumps(payload).encode()), SIGNATURES)


@pytest.mark.parametrize(
    ("payload", "form", "rows", "expected"),
    [
        ({"instances": [[1, 2], [3, 4]]}, "instances", 2, {"x": [[1, 2], [3, 4]]}),
        ({"instances": [{"x": [1.5, 2]}]}, "instances", 1, {"x": [[1.5, 2]]}),
        ({"inputs": [[1, 2]]}, "inputs", 1, {"x": [[1, 2]]}),
        ({"inputs": {"x": [[1, 2], [0, 0]]}}, "inputs", 2, {"x": [[1, 2], [0, 0]]}),
        ({"values": [[1, 2]]}, "values", 1, {"x": [[1, 2]]}),
        (
            {"signature_name": "two", "instances": [{"a": [1, 2], "b": 3}]},
            "instances",
            1,
            {"a": [[1, 2]], "b": [3]},
        ),
        (
            {"signature_name": "two", "inputs": {"a": [[1, 2], [3, 4]], "b": [5, 6.0]}},
            "inputs",
            2,
            {"a": [[1, 2], [3, 4]], "b": [5, 6]},
        ),
        (
            {"signature_name": "two", "fields": ["b", "a"], "values": [[7, [1, 2]]]},
            "values",
            1,
            {"a": [[1, 2]], "b": [7]},
        ),
        ({"signature_name": "scalar", "inputs": 2.5}, "inputs", 1, {"c": 2.5}),
        ({"signature_name": "small", "instances": [-128, 127]}, "instances", 2, {"i": [-128, 127]}),
    ],
)
def test_accepted_payloads(
    payload: dict[str, Any], form: str, rows: int, expected: dict[str, Any]
) -> None:
    request = parse(payload)
    assert request.form == PayloadForm(form)
    assert request.rows == rows
    assert set(request.tensors) == set(expected)
    for name, value in expected.items():
        info = request.signature.inputs[name]
        assert request.tensors[name].dtype == np.dtype(info.dtype)
        np.testing.assert_array_equal(request.tensors[name], np.asarray(value))


def test_strings_and_base64() -> None:
    request = parse({"signature_name": "text", "instances": ["héllo", {"b64": "AP8="}]})
    assert request.tensors["s"].dtype == object
    assert list(request.tensors["s"]) == ["héllo".encode(), b"\x00\xff"]


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        (b"", "body", "is empty"),
        (b"   \n", "body", "is empty"),
        (b"not json", "body", "not valid JSON"),
        (b'{"instances": [1,', "body", "not valid JSON"),
        (b"\xff\xfe", "body", "not valid JSON"),
        (b"[[1, 2]]", "body", "must be a JSON object"),
        (b"{}", "body", "exactly one of instances, inputs or values; has none"),
        (b'{"instances": [[1, 2]], "inputs": [[1, 2]]}', "body", "has instances and inputs"),
        (b'{"instance": [[1, 2]]}', "/instance", "not part of a prediction request"),
        (b'{"instances": [[1, 2]], "fields": ["x"]}', "/fields", "goes only with values"),
        (b'{"signature_name": "nope", "instances": [[1, 2]]}', "/signature_name", "(scalar"),
        (b'{"signature_name": 3, "instances": [[1, 2]]}', "/signature_name", "string"),
        (b'{"instances": {"x": [1, 2]}}', "/instances", "must be a list"),
        (b'{"instances": []}', "/instances", "is empty"),
        (b'{"instances": [[1, 2, 3]]}', "/instances", "x expects float32 [None, 2]"),
        (b'{"instances": [1, 2]}', "/instances", "x expects float32 [None, 2]"),
        (b'{"instances": [[1, 2], [3]]}', "/instances/1", "shape of an instance"),
        (b'{"instances": [[1, 2], [3, [4]]]}', "/instances/1", "shape of an instance"),
        (b'{"instances": [["a", "b"]]}', "/instances", "holds strings; x expects float32"),
        (b'{"instances": [[true, false]]}', "/instances", "holds true/false"),
        (b'{"instances": [[1, null]]}', "/instances", "other than numbers"),
        (b'{"instances": [[1, 2], {"x": [1, 2]}]}', "/instances/0", "must be an object"),
        (b'{"instances": [{"y": [1, 2]}]}', "/instances/0/y", "not an input"),
        (b'{"inputs": {"y": [[1, 2]]}}', "/inputs", "only input"),
        (b'{"inputs": {}}', "/inputs", "only input"),
        (b'{"inputs": []}', "/inputs/x", "has shape [0]"),
        (b'{"inputs": [[]]}', "/inputs/x", "has shape [1, 0]"),
        (b'{"values": [[1, 2], [3, 4, 5]]}', "/values/1", "shape of an instance"),
        (b'{"values": "x"}', "/values", "must be a list"),
    ],
)
def test_refused_payloads(body: bytes, field: str, fragment: str) -> None:
    with pytest.raises(InvalidPayload) as e:
        parse_request(decode_body(body), SIGNATURES)
    assert e.value.status == 400
    assert [err.field for err in e.value.errors] == [field]
    assert fragment in e.value.detail, e.value.detail


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        ({"instances": [{"a": [1, 2]}]}, "/instances/0/b", "is required"),
        ({"instances": [{"a": [1, 2], "b": 1, "c": 2}]}, "/instances/0/c", "not an input"),
        ({"instances": [{"a": [1, 2], "b": 1.5}]}, "/instances/*/b", "fractional"),
        ({"instances": [{"a": [1, 2], "b": 2**70}]}, "/instances/*/b", "outside"),
        ({"instances": [[1, 2]]}, "/instances/0", "must be an object with the inputs a, b"),
        ({"inputs": [[1, 2]]}, "/inputs", "must be an object naming a, b"),
        ({"inputs": {"a": [[1, 2]]}}, "/inputs/b", "is required"),
        ({"inputs": {"a": [[1, 2]], "b": [1, 2]}}, "/inputs", "share their first dimension"),
        ({"inputs": {"a": [[1, 2]], "b": [1], "q": 1}}, "/inputs/q", "not an input"),
        ({"values": [[1, 2]]}, "/fields", "is required"),
        ({"fields": ["a"], "values": [[1, 2]]}, "/fields", "each input"),
        ({"fields": ["a", "b"], "values": [[[1, 2]]]}, "/values/0", "list of 2 values"),
    ],
)
def test_refused_payloads_with_two_inputs(
    payload: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(InvalidPayload) as e:
        parse({"signature_name": "two", **payload})
    assert [err.field for err in e.value.errors] == [field]
    assert fragment in e.value.detail, e.value.detail


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        ({"signature_name": "small", "instances": [128]}, "/instances", "outside [-128, 127]"),
        ({"signature_name": "text", "instances": [1]}, "/instances", "neither strings"),
        ({"signature_name": "text", "instances": [{"b64": "***"}]}, "/instances", "base64"),
        ({"signature_name": "text", "instances": [["a"], "b"]}, "/instances/0", "shape"),
        ({"signature_name": "scalar", "instances": [1.0]}, "/instances", "columnar form"),
        ({"signature_name": "scalar", "inputs": [1.0]}, "/inputs/c", "float32 []"),
    ],
)
def test_refused_dtypes_and_forms(payload: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(InvalidPayload) as e:
        parse(payload)
    assert [err.field for err in e.value.errors] == [field]
    assert fragment in e.value.detail, e.value.detail


def answer(payload: dict[str, Any], outputs: dict[str, Any]) -> Any:
    request = parse(payload)
    arrays = {k: np.asarray(v) for k, v in outputs.items()}
    return json.loads(encode_answer(render(request, arrays)))


def test_answers_take_the_form_of_the_request() -> None:
    y = np.array([[3.5], [-1.5]], dtype=np.float32)
    assert answer({"instances": [[1, 0], [0, 1]]}, {"y": y}) == {"predictions": [[3.5], [-1.5]]}
    assert answer({"inputs": [[1, 0], [0, 1]]}, {"y": y}) == {"outputs": [[3.5], [-1.5]]}
    assert answer({"values": [[1, 0], [0, 1]]}, {"y": y}) == {
        "fields": ["y"],
        "values": [[[3.5]], [[-1.5]]],
    }
    two = {"y": np.array([[1.0], [2.0]], np.float32), "z": np.array([5.0, 6.0], np.float32)}
    rows = {"signature_name": "two", "instances": [{"a": [1, 2], "b": 1}] * 2}
    assert answer(rows, two) == {"predictions": [{"y": [1.0], "z": 5.0}, {"y": [2.0], "z": 6.0}]}
    columns = {"signature_name": "two", "inputs": {"a": [[1, 2]] * 2, "b": [1, 2]}}
    assert answer(columns, two) == {"outputs": {"y": [[1.0], [2.0]], "z": [5.0, 6.0]}}
    wml = {"signature_name": "two", "fields": ["a", "b"], "values": [[[1, 2], 1]] * 2}
    assert answer(wml, two) == {"fields": ["y", "z"], "values": [[[1.0], 5.0], [[2.0], 6.0]]}


def test_answers_write_floats_exactly_strings_as_text_and_nan_as_null() -> None:
    y = np.array([[0.1], [np.nan]], dtype=np.float32)
    got = answer({"instances": [[1, 0], [0, 1]]}, {"y": y})["predictions"]
    assert np.float32(got[0][0]) == np.float32(0.1) and got[1] == [None]
    text = np.array([b"ok", b"\xff"], dtype=object)
    request = parse({"signature_name": "text", "instances": ["a", "b"]})
    body = json.loads(encode_answer(render(request, {"n": text})))
    assert body == {"predictions": ["ok", {"b64": "/w=="}]}
