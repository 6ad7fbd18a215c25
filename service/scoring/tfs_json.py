"""TensorFlow Serving's REST JSON: request bodies in, answers out, as its json_tensor
writes them. Pure: JSON and numpy, no TensorFlow.

In: a body is a JSON object; `NaN`, `Infinity` and `-Infinity` are numbers (TensorFlow
Serving parses with rapidjson's kParseNanAndInfFlag). `:predict` takes the row form
`instances` or the columnar `inputs` (and `signature_name`), checked against the
signature as the platform's own route checks them (`inputs.parse_request`).

Out: `{"predictions": ...}` (row form: one entry per instance, an object of outputs when
there are several) or `{"outputs": ...}` (columnar); `:classify` answers `{"results":
[[[label, score], ...], ...]}`, `:regress` `{"results": [value, ...]}`. Floats are
written as TensorFlow Serving writes them: printf's `%g`, or with max_digits10 digits
when that does not read back as the same value, `.0` after a whole number, and `NaN`,
`Infinity`, `-Infinity`; string outputs whose name ends in `_bytes` as `{"b64": ...}`
(and, since JSON text is UTF-8, any string that is not).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from service.domain.signature import SignatureInfo
from service.scoring.arrays import InvalidPayload
from service.scoring.inputs import PayloadForm, ScoringRequest, parse_request
from service.scoring.tfs_infer import Class

_PREDICT_KEYS = ("signature_name", "instances", "inputs")
_BYTES_SUFFIX = "_bytes"


def load_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body (NaN and infinities allowed)."""
    if not body.strip():
        raise InvalidPayload("body", "JSON Parse error: The document is empty")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:  # the standard library reads NaN, Infinity and -Infinity; orjson does not
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidPayload("body", f"JSON Parse error: {e}") from e
    if not isinstance(payload, dict):
        raise InvalidPayload("body", "JSON Value is not an object")
    return payload


def predict_request(
    payload: Mapping[str, Any], signatures: Mapping[str, SignatureInfo]
) -> ScoringRequest:
    """A `:predict` body, checked against the signature it names. Other keys are
    ignored, as TensorFlow Serving ignores them."""
    if "instances" not in payload and "inputs" not in payload:
        raise InvalidPayload("body", "Missing 'inputs' or 'instances' key")
    return parse_request({k: payload[k] for k in _PREDICT_KEYS if k in payload}, signatures)


def signature_name(payload: Mapping[str, Any]) -> str:
    name = payload.get("signature_name", "")
    if not isinstance(name, str):
        raise InvalidPayload(
            "/signature_name",
            "not formatted correctly. 'signature_name' key must be a string value.",
        )
    return name


# ---- answers ----


def _decimal(narrow: Callable[[float], float], digits: int) -> Callable[[float], str]:
    def write(value: float) -> str:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "-Infinity" if value < 0 else "Infinity"
        text = f"{value:g}"
        if narrow(float(text)) != value:
            text = f"{value:.{digits}g}"
        if "." not in text and "e" not in text:
            text += ".0"
        return text

    return write


_FLOAT32 = _decimal(lambda v: float(np.float32(v)), 9)
_FLOAT64 = _decimal(lambda v: v, 17)


def _string(value: object, as_bytes: bool) -> str:
    raw = value if isinstance(value, bytes) else str(value).encode()
    if not as_bytes:
        try:
            return orjson.dumps(raw.decode()).decode()
        except UnicodeDecodeError:
            pass
    return '{"b64": "' + base64.b64encode(raw).decode() + '"}'


def _values(array: np.ndarray, name: str) -> list[str]:
    """Each value of `array` (flattened) as JSON text."""
    kind = array.dtype.kind
    flat = array.reshape(-1)
    if kind == "f":
        write = _FLOAT64 if array.dtype.itemsize == 8 else _FLOAT32
        return [
            write(v)
            for v in flat.astype(np.float64 if array.dtype.itemsize == 8 else np.float32).tolist()
        ]
    if kind == "b":
        return ["true" if v else "false" for v in flat.tolist()]
    if kind in "iu":
        return [str(v) for v in flat.tolist()]
    if kind in "OSU":
        as_bytes = name.endswith(_BYTES_SUFFIX)
        return [_string(v, as_bytes) for v in flat.tolist()]
    raise InvalidPayload(
        f"/outputs/{name}", f"Failed to write JSON value for tensor type: {array.dtype}"
    )


def _nest(items: Sequence[str], shape: Sequence[int]) -> str:
    if not shape:
        return items[0]
    if len(shape) == 1:
        return "[" + ",".join(items) + "]"
    step = math.prod(shape[1:])
    return (
        "["
        + ",".join(_nest(items[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0]))
        + "]"
    )


def _key(name: str) -> str:
    return orjson.dumps(name).decode()


def predict_answer(request: ScoringRequest, outputs: Mapping[str, np.ndarray]) -> bytes:
    """The answer to a `:predict` in the form it was asked in."""
    names = [n for n in request.signature.outputs if n in outputs] or sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    texts = {n: _values(a, n) for n, a in arrays.items()}
    if request.form == PayloadForm.INPUTS:
        columns = {n: _nest(texts[n], arrays[n].shape) for n in names}
        if len(names) == 1:
            return ('{"outputs": ' + columns[names[0]] + "}").encode()
        body = ",".join(f"{_key(n)}: {columns[n]}" for n in names)
        return ('{"outputs": {' + body + "}}").encode()
    for n, a in arrays.items():
        if a.ndim == 0:
            raise InvalidPayload(f"/outputs/{n}", f"Tensor name: {n} has no shape information")
        if a.shape[0] != request.rows:
            raise InvalidPayload(
                f"/outputs/{n}",
                f"Tensor name: {n} has inconsistent batch size: {a.shape[0]} expecting: "
                f"{request.rows}",
            )
    rows = []
    for i in range(request.rows):
        parts = {}
        for n, a in arrays.items():
            step = math.prod(a.shape[1:])
            parts[n] = _nest(texts[n][i * step : (i + 1) * step], a.shape[1:])
        if len(names) == 1:
            rows.append(parts[names[0]])
        else:
            rows.append("{" + ",".join(f"{_key(n)}: {parts[n]}" for n in names) + "}")
    return ('{"predictions": [' + ",".join(rows) + "]}").encode()


def classify_answer(results: Sequence[Sequence[Class]]) -> bytes:
    """`{"results": [[[label, score], ...], ...]}` (a class without a score: 0.0, the
    default TensorFlow Serving's message holds)."""
    items = []
    for classes in results:
        pairs = [
            "[" + _string(c.label, False) + ", " + _FLOAT32(float(np.float32(c.score or 0.0))) + "]"
            for c in classes
        ]
        items.append("[" + ", ".join(pairs) + "]")
    return ('{"results": [' + ", ".join(items) + "]}").encode()


def regress_answer(values: Sequence[float]) -> bytes:
    """`{"results": [value, ...]}`."""
    return (
        '{"results": [' + ", ".join(_FLOAT32(float(np.float32(v))) for v in values) + "]}"
    ).encode()
