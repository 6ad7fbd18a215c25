"""TensorProto <-> numpy without TensorFlow (service.scoring.tensors, tfs_protos) against
TensorFlow's own make_tensor_proto and make_ndarray, and the messages built without
importing TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from service.domain.signature import TensorInfo
from service.scoring.arrays import InvalidPayload
from service.scoring.tensors import DATA_TYPES, TensorCodec
from service.scoring.tfs_protos import ProtosMissing, serialized_descriptor, serving_messages

tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")
pytest.importorskip("tensorflow_serving.apis", reason="make install")

MESSAGES = serving_messages()
CODEC = TensorCodec(MESSAGES.data_types, max_bytes=1024 * 1024)


def examples() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    numbers = [
        rng.uniform(-5, 5, size=(3, 2)).astype(dtype)
        for dtype in ("float16", "float32", "float64", "complex64", "complex128")
    ]
    integers = [
        rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, size=(2, 3), dtype=dtype)
        for dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    ]
    return [
        *numbers,
        *integers,
        np.array([[True, False], [False, True]]),
        np.array([[b"a", b"\xff\x00"], [b"", "é".encode()]], dtype=object),
    ]


def info_of(array: np.ndarray) -> TensorInfo:
    dtype = "string" if array.dtype == object else array.dtype.name
    return TensorInfo("x", dtype, (None, *array.shape[1:]))


def ours(tensor: Any) -> Any:
    """A TensorFlow TensorProto as one of ours (the bytes on the wire)."""
    return MESSAGES.TensorProto.FromString(tensor.SerializeToString())


@pytest.mark.parametrize("array", examples(), ids=lambda a: str(a.dtype))
def test_what_tensorflow_writes_reads_back_the_same(array: np.ndarray) -> None:
    read = CODEC.to_array(ours(tf.make_tensor_proto(array)), info_of(array), "/inputs/x")
    assert read.shape == array.shape
    np.testing.assert_array_equal(read, array)


@pytest.mark.parametrize("array", examples(), ids=lambda a: str(a.dtype))
def test_what_we_write_tensorflow_reads_the_same(array: np.ndarray) -> None:
    response = MESSAGES.PredictResponse()
    CODEC.to_proto(array, response.outputs["y"])
    tensor = tf.make_tensor_proto(0.0)
    tensor.ParseFromString(response.outputs["y"].SerializeToString())
    read = tf.make_ndarray(tensor)
    assert read.shape == array.shape
    np.testing.assert_array_equal(read, array)
    assert tensor.dtype == tf.as_dtype(array.dtype).as_datatype_enum


@pytest.mark.parametrize(
    ("values", "dtype", "shape"),
    [
        ([1.5], tf.float32, [2, 3]),  # one value fills the shape
        ([1, 2], tf.int64, [2, 2]),  # the last value repeats
        ([True], tf.bool, [3]),
        (["a", "b"], tf.string, [3]),
        ([1.0, 2.0], tf.complex64, [2]),
        ([0.5], tf.float16, [2]),
    ],
)
def test_typed_values_fill_the_shape_as_make_ndarray_does(
    values: list[Any], dtype: Any, shape: list[int]
) -> None:
    tensor = tf.make_tensor_proto(values, dtype=dtype, shape=shape)
    tensor.ClearField("tensor_content")  # the typed field, as other clients send
    field = {
        tf.float32: "float_val",
        tf.int64: "int64_val",
        tf.bool: "bool_val",
        tf.string: "string_val",
        tf.complex64: "scomplex_val",
        tf.float16: "half_val",
    }[dtype]
    if not getattr(tensor, field):
        typed = {
            tf.complex64: [v for c in values for v in (float(np.real(c)), float(np.imag(c)))],
            tf.float16: np.array(values, np.float16).view(np.uint16).tolist(),
        }.get(dtype, values)
        getattr(tensor, field).extend(typed)
    expected = tf.make_ndarray(tensor)
    dtype_name = "string" if dtype == tf.string else dtype.name
    read = CODEC.to_array(ours(tensor), TensorInfo("x", dtype_name, None), "/inputs/x")
    np.testing.assert_array_equal(read, expected)


def test_tensors_that_do_not_fit_are_refused_naming_the_field() -> None:
    info = TensorInfo("x", "float32", (None, 2))
    cases: list[tuple[Any, str]] = []
    as_double = ours(tf.make_tensor_proto(np.zeros((1, 2), np.float64)))
    cases.append((as_double, "/inputs/x: is a DT_DOUBLE tensor; x expects float32 [None, 2]"))
    too_many = MESSAGES.TensorProto(dtype=MESSAGES.data_types["DT_FLOAT"], float_val=[1, 2, 3])
    too_many.tensor_shape.dim.add().size = 1
    too_many.tensor_shape.dim.add().size = 2
    cases.append((too_many, "/inputs/x: has 3 values for shape [1, 2]"))
    huge = ours(tf.make_tensor_proto(0.0, dtype=tf.float32, shape=[1 << 20, 2]))
    cases.append((huge, "/inputs/x: shape [1048576, 2] holds more than the 1048576 bytes"))
    unknown = MESSAGES.TensorProto(dtype=MESSAGES.data_types["DT_FLOAT"])
    unknown.tensor_shape.unknown_rank = True
    cases.append((unknown, "/inputs/x: has an unknown rank"))
    for tensor, message in cases:
        with pytest.raises(InvalidPayload) as error:
            CODEC.to_array(tensor, info, "/inputs/x")
        assert error.value.detail.startswith(message), error.value.detail
    wide = MESSAGES.TensorProto(dtype=MESSAGES.data_types["DT_UINT8"], int_val=[300, 1])
    wide.tensor_shape.dim.add().size = 2
    with pytest.raises(InvalidPayload, match="outside the range of uint8"):
        CODEC.to_array(wide, TensorInfo("x", "uint8", None), "/inputs/x")


def test_every_signature_dtype_has_a_tensorflow_data_type() -> None:
    for name, tf_name in DATA_TYPES.items():
        assert MESSAGES.data_types[tf_name] == tf.as_dtype(name).as_datatype_enum


def test_the_messages_are_built_without_importing_tensorflow() -> None:
    code = (
        "import sys\n"
        "from service.scoring.grpc_api import PredictionService\n"
        "from service.scoring.tfs_protos import serving_messages\n"
        "m = serving_messages()\n"
        "r = m.PredictRequest(); r.model_spec.name = 'd'\n"
        "assert r.SerializeToString()\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] == 'tensorflow'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_missing_package_names_what_to_install() -> None:
    with pytest.raises(ProtosMissing, match="pip install --no-deps 'tensorflow-serving-api"):
        serialized_descriptor("tensorflow_serving/apis/nosuch.proto")
