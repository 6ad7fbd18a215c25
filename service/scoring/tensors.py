"""TensorFlow's TensorProto to numpy arrays and back, with numpy alone (the scoring process
does not import TensorFlow, whose `make_ndarray` and `make_tensor_proto` these follow).

A tensor's values are either `tensor_content` (the raw little-endian bytes, what
`tf.make_tensor_proto` writes for numbers) or the typed repeated field of its dtype
(`float_val`, `int64_val`, `string_val`, ...), where fewer values than the shape holds
repeat the last one. Answers are written as `tensor_content` for numbers (one copy of the
bytes) and `string_val` for strings, as TensorFlow writes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from service.domain.signature import TensorInfo
from service.scoring.arrays import InvalidPayload

# numpy's dtype names (those of the signatures) and TensorFlow's DataType names.
DATA_TYPES = {
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int32": "DT_INT32",
    "uint8": "DT_UINT8",
    "int16": "DT_INT16",
    "int8": "DT_INT8",
    "string": "DT_STRING",
    "complex64": "DT_COMPLEX64",
    "int64": "DT_INT64",
    "bool": "DT_BOOL",
    "uint16": "DT_UINT16",
    "complex128": "DT_COMPLEX128",
    "float16": "DT_HALF",
    "uint32": "DT_UINT32",
    "uint64": "DT_UINT64",
}
# The repeated field that holds a dtype's values when tensor_content is empty.
_VALUE_FIELDS = {
    "float32": "float_val",
    "float64": "double_val",
    "int32": "int_val",
    "uint8": "int_val",
    "int16": "int_val",
    "int8": "int_val",
    "uint16": "int_val",
    "int64": "int64_val",
    "uint32": "uint32_val",
    "uint64": "uint64_val",
    "bool": "bool_val",
    "float16": "half_val",
    "complex64": "scomplex_val",
    "complex128": "dcomplex_val",
    "string": "string_val",
}
_LITTLE = {name: np.dtype(name).newbyteorder("<") for name in _VALUE_FIELDS if name != "string"}
# An array's dtype -> its name here (numpy's dtype.name is slow), native and little-endian.
_NAMES = {np.dtype(name): name for name in _LITTLE} | {
    dtype: name for name, dtype in _LITTLE.items()
}
# Past this many dimensions or values a shape is refused before anything is allocated.
_MAX_DIMS = 32


class TensorCodec:
    """Converts between TensorProto messages of one descriptor pool and numpy arrays."""

    def __init__(self, data_types: Mapping[str, int], *, max_bytes: int) -> None:
        # Values repeated to fill a shape (see _from_values) may not grow past this.
        self._max_bytes = max_bytes
        self._numbers = {name: data_types[tf_name] for name, tf_name in DATA_TYPES.items()}
        self._names = {number: name for name, number in self._numbers.items()}
        self._tf_names = {number: name for name, number in data_types.items()}

    def data_type(self, dtype: str) -> int:
        """The DataType number of a numpy dtype name (DT_INVALID, 0, for one it lacks)."""
        return self._numbers.get(dtype, 0)

    def to_array(self, tensor: Any, info: TensorInfo, field: str) -> np.ndarray:
        """`tensor` as an array of `info`'s dtype; InvalidPayload naming `field` when its
        dtype is not the input's or its values do not fill its shape."""
        dtype = self._names.get(tensor.dtype)
        if dtype != info.dtype:
            got = self._tf_names.get(tensor.dtype, str(tensor.dtype))
            raise InvalidPayload(
                field,
                f"is a {got} tensor; {info.name} expects {info.describe()} "
                f"({DATA_TYPES.get(info.dtype, info.dtype)})",
            )
        if tensor.tensor_shape.unknown_rank:
            raise InvalidPayload(field, "has an unknown rank; send the tensor's shape")
        dims = tensor.tensor_shape.dim
        if len(dims) > _MAX_DIMS:
            raise InvalidPayload(field, f"has more than {_MAX_DIMS} dimensions")
        shape = tuple(d.size for d in dims)
        if any(size < 0 for size in shape):
            raise InvalidPayload(field, "has a dimension of negative size")
        count = math.prod(shape)
        itemsize = 8 if dtype == "string" else _LITTLE[dtype].itemsize
        if count * itemsize > self._max_bytes:
            raise InvalidPayload(
                field,
                f"shape {list(shape)} holds more than the {self._max_bytes} bytes a "
                "prediction request may have (DLAAS_MAX_PREDICTION_BYTES)",
            )
        if dtype == "string":
            return _strings(list(tensor.string_val), shape, count, field)
        if tensor.tensor_content:
            content: bytes = tensor.tensor_content
            item = _LITTLE[dtype]
            if len(content) != count * item.itemsize:
                raise InvalidPayload(
                    field,
                    f"tensor_content has {len(content)} bytes for {count} {dtype} values "
                    f"(shape {list(shape)})",
                )
            return np.frombuffer(content, dtype=item).reshape(shape)
        return _from_values(tensor, dtype, shape, count, field)

    def to_proto(self, array: np.ndarray, into: Any) -> None:
        """Write `array` into the TensorProto `into` (a map entry of a response)."""
        dtype = "string" if array.dtype.kind in "OSU" else _NAMES.get(array.dtype, "")
        into.dtype = self.data_type(dtype)
        for size in array.shape:
            into.tensor_shape.dim.add().size = size
        if dtype == "string":
            into.string_val.extend(
                v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1).tolist()
            )
            return
        little = _LITTLE.get(dtype)
        if little is None:
            raise ValueError(f"outputs of dtype {array.dtype} cannot be sent")
        into.tensor_content = np.ascontiguousarray(array, dtype=little).tobytes()


def _strings(values: list[bytes], shape: tuple[int, ...], count: int, field: str) -> np.ndarray:
    if len(values) > count:
        raise InvalidPayload(field, f"has {len(values)} values for shape {list(shape)}")
    if count and not values:
        raise InvalidPayload(field, f"has no values for shape {list(shape)}")
    values = values + [values[-1]] * (count - len(values)) if values else values
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(shape)


def _from_values(
    tensor: Any, dtype: str, shape: tuple[int, ...], count: int, field: str
) -> np.ndarray:
    """The typed repeated field's values, the last one repeated to fill the shape (as
    TensorFlow's make_ndarray does)."""
    raw = getattr(tensor, _VALUE_FIELDS[dtype])
    try:
        values = _typed(raw, dtype, field)
    except OverflowError as e:
        raise InvalidPayload(field, f"holds values outside the range of {dtype}") from e
    if values.size > count:
        raise InvalidPayload(field, f"has {values.size} values for shape {list(shape)}")
    if values.size == 0:
        return np.zeros(shape, dtype=np.dtype(dtype))
    if values.size < count:
        values = np.pad(values, (0, count - values.size), mode="edge")
    return values.reshape(shape)


def _typed(raw: Any, dtype: str, field: str) -> np.ndarray:
    if dtype == "float16":
        values = np.array(raw, dtype=np.uint16).view(np.float16)
    elif dtype in ("complex64", "complex128"):
        parts = np.array(raw, dtype=np.float32 if dtype == "complex64" else np.float64)
        if len(parts) % 2:
            raise InvalidPayload(field, "holds an odd number of complex parts")
        values = parts.view(np.dtype(dtype))
    elif _VALUE_FIELDS[dtype] == "int_val" and dtype != "int32":
        # int_val holds int32s: narrower dtypes are checked, not wrapped around.
        wide = np.array(raw, dtype=np.int32)
        limits = np.iinfo(dtype)
        if wide.size and (wide.min() < limits.min or wide.max() > limits.max):
            raise OverflowError(dtype)
        values = wide.astype(dtype)
    else:
        values = np.array(raw, dtype=np.dtype(dtype))
    return values
