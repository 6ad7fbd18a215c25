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
(and, since JSON text is UTF-8, any string that is not). Writing thousands of floats
one by one costs more than the model call, so float32 outputs in [1e-4, 1e6) (and
zeros) are rounded to those decimals as arrays and written by orjson (the same text:
in that range neither printf form uses an exponent, and orjson writes the shortest
decimal, which is that one, with its `.0`); anything else is written value by value.
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


_SPECIAL = {"nan": "NaN", "-nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _floats(flat: np.ndarray) -> list[str]:
    """`_FLOAT32` (or `_FLOAT64`) of each value, the read-back check done for the whole
    array at once: a batch's outputs are thousands of floats."""
    double = flat.dtype.itemsize == 8
    narrow = np.float64 if double else np.float32
    values = flat.astype(narrow, copy=False)
    wide = values.astype(np.float64).tolist()
    texts = [f"{v:g}" for v in wide]
    # Read back by numpy's C parser in one call (a Python float() each is slower than
    # the formatting); past float32's range it reads inf, which compares unequal too.
    with np.errstate(invalid="ignore", over="ignore"):
        back = np.fromstring(" ".join(texts), dtype=np.float64, sep=" ").astype(narrow)
    digits = 17 if double else 9
    for i in np.flatnonzero(back != values).tolist():
        texts[i] = f"{wide[i]:.{digits}g}"
    for i, text in enumerate(texts):
        if "." not in text and "e" not in text:
            texts[i] = _SPECIAL.get(text) or text + ".0"
    return texts


# Powers of ten a float32's 24-bit significand times 10**k stays exact under (5**12 <
# 2**28: 24 + 28 bits fit float64's 53), and the exponents whose %g and %.9g shifts
# (5 - e, 8 - e) both land in 0..12.
_EXACT_SHIFT = 12
_POWERS = 10.0 ** np.arange(0, _EXACT_SHIFT + 1)
_FAST_EXPONENTS = (-4, 5)


def _rounded(wide: np.ndarray, exponents: np.ndarray, digits: int) -> np.ndarray:
    """Each value rounded to `digits` significant decimal digits (ties to even, as
    printf), as the float64 a JSON parser reads that decimal as: the scaled value is
    exact, its rounding an integer below 10**9, and one division by an exact power of
    ten rounds once, as parsing the decimal does."""
    shift = digits - 1 - exponents
    powers = _POWERS[shift]
    rounded: np.ndarray = np.round(wide * powers) / powers
    return rounded


def _fast_float32(values: np.ndarray) -> np.ndarray | None:
    """The float32 values as TensorFlow Serving writes them (`_FLOAT32`), as float64s
    that orjson writes in their shortest form (the same decimal), computed for the whole
    array; None where a value is outside what this computes exactly (not finite, or
    outside [1e-4, 1e6)), for `_floats` to write one by one."""
    wide = values.astype(np.float64)
    magnitude = np.abs(wide)
    if not np.all(np.isfinite(magnitude)):
        return None
    zero = magnitude == 0
    with np.errstate(divide="ignore"):
        exponents = np.floor(np.log10(np.where(zero, 1.0, magnitude))).astype(np.int64)
    low, high = _FAST_EXPONENTS
    if exponents.size and (exponents.min() < low or exponents.max() > high):
        return None
    # log10's floor can be one off beside a power of ten: the scaled value (exact) says.
    scaled = magnitude * _POWERS[8 - exponents]
    exponents += (scaled >= 1e9).astype(np.int64) - ((scaled < 1e8) & ~zero).astype(np.int64)
    if exponents.size and (exponents.min() < low or exponents.max() > high):
        return None
    six = _rounded(wide, exponents, 6)
    nine = _rounded(wide, exponents, 9)
    result: np.ndarray = np.where(six.astype(np.float32) == values, six, nine)
    return result


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
        return _floats(flat)
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


def _as_numbers(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The outputs as arrays orjson writes as TensorFlow Serving would (integers and
    booleans as they are, float32 through `_fast_float32`); None when one is not."""
    numbers = {}
    for name, array in arrays.items():
        kind = array.dtype.kind
        if kind in "biu":
            numbers[name] = array
        elif array.dtype == np.float32:
            fast = _fast_float32(array.reshape(-1))
            if fast is None:
                return None
            numbers[name] = fast.reshape(array.shape)
        else:
            return None
    return numbers


def _check_rows(request: ScoringRequest, arrays: Mapping[str, np.ndarray]) -> None:
    for n, a in arrays.items():
        if a.ndim == 0:
            raise InvalidPayload(f"/outputs/{n}", f"Tensor name: {n} has no shape information")
        if a.shape[0] != request.rows:
            raise InvalidPayload(
                f"/outputs/{n}",
                f"Tensor name: {n} has inconsistent batch size: {a.shape[0]} expecting: "
                f"{request.rows}",
            )


def predict_answer(request: ScoringRequest, outputs: Mapping[str, np.ndarray]) -> bytes:
    """The answer to a `:predict` in the form it was asked in: numbers written by orjson
    where `_as_numbers` can give them, else value by value."""
    names = [n for n in request.signature.outputs if n in outputs] or sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    columnar = request.form == PayloadForm.INPUTS
    if not columnar:
        _check_rows(request, arrays)
    numbers = _as_numbers(arrays)
    if numbers is not None:
        answer: dict[str, Any]
        if columnar:
            answer = {"outputs": numbers[names[0]] if len(names) == 1 else numbers}
        elif len(names) == 1:
            answer = {"predictions": numbers[names[0]]}
        else:
            answer = {
                "predictions": [{n: numbers[n][i] for n in names} for i in range(request.rows)]
            }
        return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    texts = {n: _values(a, n) for n, a in arrays.items()}
    if request.form == PayloadForm.INPUTS:
        columns = {n: _nest(texts[n], arrays[n].shape) for n in names}
        if len(names) == 1:
            return ('{"outputs": ' + columns[names[0]] + "}").encode()
        body = ",".join(f"{_key(n)}: {columns[n]}" for n in names)
        return ('{"outputs": {' + body + "}}").encode()
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
