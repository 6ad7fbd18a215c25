"""JSON values to numpy arrays of a signature's dtypes and shapes, and back.

Pure: numpy and orjson, no TensorFlow. Whatever does not fit is an `InvalidPayload` (400)
naming the field, the input and the dtype and shape it expects.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from service.domain.signature import TensorInfo
from service.errors import BadRequest, FieldError


class InvalidPayload(BadRequest):
    title = "Invalid prediction request"
    slug = "invalid-prediction-request"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", errors=[FieldError(field, message)])


class UnknownSignature(InvalidPayload):
    """A signature the model does not have: 400 on the platform's route, and
    FAILED_PRECONDITION (TensorFlow Serving's code) on TensorFlow Serving's API."""

    serving_code = "FAILED_PRECONDITION"


def encode_answer(answer: Mapping[str, Any]) -> bytes:
    """JSON bytes of a rendered answer: numpy arrays written directly, each float in the
    shortest form that reads back as the same value of its dtype; NaN and infinities as
    null (JSON has no such numbers)."""
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY, default=_json_default)


def json_ready(array: np.ndarray) -> Any:
    """Numbers stay arrays (encode_answer writes them); anything else becomes JSON values."""
    return array if array.dtype.kind in "biuf" else to_json_value(array)


def _json_default(value: Any) -> Any:
    # What orjson does not write itself: arrays that are not C-contiguous, numpy scalars
    # of other kinds.
    if isinstance(value, np.ndarray):
        return to_json_value(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return to_json_value(np.asarray(value))
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def to_json_value(array: np.ndarray) -> Any:
    """Numbers and booleans as JSON numbers and booleans; strings as text, or
    {"b64": ...} when they are not UTF-8 (TensorFlow Serving's convention)."""
    kind = array.dtype.kind
    if kind in "biuf":
        return array.tolist()
    if kind == "c":
        return np.stack([array.real, array.imag], axis=-1).tolist()
    return _json_strings(array.tolist())


def _json_strings(value: Any) -> Any:
    if isinstance(value, list):
        return [_json_strings(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    return value


_INT_LIMITS = {name: np.iinfo(name) for name in ("int8", "int16", "int32", "int64")} | {
    name: np.iinfo(name) for name in ("uint8", "uint16", "uint32", "uint64")
}


def _numpy_dtype(info: TensorInfo, field: str) -> np.dtype[Any]:
    try:
        dtype = np.dtype(info.dtype)
    except TypeError as e:
        raise InvalidPayload(
            field, f"{info.name} is a {info.dtype} input, which JSON requests cannot fill"
        ) from e
    if dtype.kind not in "biufc":
        raise InvalidPayload(
            field, f"{info.name} is a {info.dtype} input, which JSON requests cannot fill"
        )
    return dtype


def to_array(value: Any, info: TensorInfo, field: str, *, batch: bool) -> np.ndarray:
    """`value` (the whole batch when `batch`) as an array of `info`'s dtype and shape."""
    try:
        if info.dtype == "string":
            array = _string_array(value, info, field)
        else:
            array = _number_array(value, info, field)
    except _Ragged as e:
        raise _ragged(value, info, field, batch=batch) from e
    check_shape(array, info, field, batch=batch)
    return array


class _Ragged(Exception):
    pass


def _ragged(value: Any, info: TensorInfo, field: str, *, batch: bool) -> InvalidPayload:
    """Name the first instance whose shape differs from what the input expects."""
    if batch and isinstance(value, list) and info.shape is not None:
        want = info.shape[1:]
        for i, instance in enumerate(value):
            try:
                got = np.asarray(instance).shape
            except ValueError:
                got = None
            if (
                got is None
                or len(got) != len(want)
                or any(w is not None and w != g for w, g in zip(want, got, strict=True))
            ):
                return InvalidPayload(
                    f"{field}/{i}", f"does not have the shape of an instance; {_expects(info)}"
                )
    return InvalidPayload(field, f"nested lists of different lengths; {_expects(info)}")


def _expects(info: TensorInfo) -> str:
    return f"{info.name} expects {info.describe()}"


def _number_array(value: Any, info: TensorInfo, field: str) -> np.ndarray:
    dtype = _numpy_dtype(info, field)
    try:
        raw = np.asarray(value)
    except ValueError as e:
        raise _Ragged from e
    kind = raw.dtype.kind
    if raw.size == 0 and kind == "f":
        kind = dtype.kind  # [] has no values to disagree with the dtype
    if kind in "US":
        raise InvalidPayload(field, f"holds strings; {_expects(info)}")
    if kind == "O":
        raise InvalidPayload(field, f"holds something other than numbers; {_expects(info)}")
    if dtype.kind == "b":
        if kind != "b":
            raise InvalidPayload(field, f"holds numbers; {_expects(info)} (true or false)")
        return raw
    if kind == "b":
        raise InvalidPayload(field, f"holds true/false; {_expects(info)}")
    if dtype.kind in "iu":
        if kind == "f" and not (np.all(np.isfinite(raw)) and np.all(np.floor(raw) == raw)):
            raise InvalidPayload(field, f"holds fractional numbers; {_expects(info)}")
        if raw.size:
            limits = _INT_LIMITS[dtype.name]
            if raw.min() < limits.min or raw.max() > limits.max:
                raise InvalidPayload(
                    field, f"holds numbers outside [{limits.min}, {limits.max}]; {_expects(info)}"
                )
    with np.errstate(over="ignore"):
        return raw.astype(dtype, copy=False)


def _string_array(value: Any, info: TensorInfo, field: str) -> np.ndarray:
    try:
        array = np.array(_to_bytes(value), dtype=object)
    except TypeError as e:
        raise InvalidPayload(field, f"{e}; {_expects(info)}") from e
    except ValueError as e:
        raise _Ragged from e
    if any(not isinstance(v, bytes) for v in array.flat):
        raise _Ragged
    return array


def _to_bytes(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error as e:
            raise TypeError("holds a b64 value that is not base64") from e
    if isinstance(value, list):
        return [_to_bytes(v) for v in value]
    raise TypeError('holds values that are neither strings nor {"b64": ...}')


def check_shape(array: np.ndarray, info: TensorInfo, field: str, *, batch: bool) -> None:
    """InvalidPayload naming `field` unless `array` has `info`'s shape."""
    expected = info.shape
    if expected is None:
        return
    got = array.shape
    if len(got) == len(expected) and all(
        e is None or e == g for e, g in zip(expected, got, strict=True)
    ):
        return
    shown = f"[{', '.join(str(d) for d in got)}]"
    if batch and len(got) >= 1:
        per_instance = f"[{', '.join(str(d) for d in got[1:])}]"
        raise InvalidPayload(
            field, f"instances of shape {per_instance} (batch {shown}); {_expects(info)}"
        )
    raise InvalidPayload(field, f"has shape {shown}; {_expects(info)}")
