"""TensorFlow Serving's API messages (PredictRequest, GetModelMetadataResponse, ...) without
importing TensorFlow.

The generated modules of the `tensorflow-serving-api` package import
`tensorflow.core.framework.tensor_pb2` and the like, and importing any module under
`tensorflow` runs TensorFlow's own `__init__` (about 0.5 GB and seconds of start-up): the
scoring process never imports TensorFlow (only the model processes do). The messages'
descriptors are data, though: each generated `*_pb2.py` file holds its `.proto` file as a
serialized FileDescriptorProto. Here they are read from the installed files (of
`tensorflow-serving-api`, and of TensorFlow for the tensor, shape and graph messages it
depends on) without executing them, added to a private descriptor pool, and the message
classes made from that pool by protobuf itself. The wire format is the one an unmodified
TensorFlow Serving client speaks; the classes are distinct from the ones that client
imports, so both live in one process without clashing.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pool, message_factory

# What the gRPC API needs; their dependencies are found from the descriptors themselves.
_ROOTS = (
    "tensorflow_serving/apis/predict.proto",
    "tensorflow_serving/apis/get_model_metadata.proto",
    "tensorflow_serving/apis/classification.proto",
    "tensorflow_serving/apis/regression.proto",
    "tensorflow_serving/apis/inference.proto",
    "tensorflow_serving/apis/get_model_status.proto",
)
INSTALL_HINT = (
    "the scoring gRPC API needs the tensorflow-serving-api package, installed without its "
    "dependencies so that it does not replace tensorflow-cpu: "
    "pip install --no-deps 'tensorflow-serving-api==2.21.*' (make install does)"
)


class ProtosMissing(RuntimeError):
    """A .proto file's generated module is not installed (see INSTALL_HINT)."""


@dataclass(frozen=True)
class ServingMessages:
    """The message classes of TensorFlow Serving's PredictionService and ModelService (and
    tf.Example, which Classify and Regress take), and DataType's values by name
    (DT_FLOAT, ...)."""

    PredictRequest: Any
    PredictResponse: Any
    GetModelMetadataRequest: Any
    GetModelMetadataResponse: Any
    SignatureDefMap: Any
    TensorProto: Any
    ClassificationRequest: Any
    ClassificationResponse: Any
    RegressionRequest: Any
    RegressionResponse: Any
    MultiInferenceRequest: Any
    MultiInferenceResponse: Any
    GetModelStatusRequest: Any
    GetModelStatusResponse: Any
    Example: Any
    data_types: dict[str, int]


# .proto files whose generated modules TensorFlow installs under another package.
_MOVED = {"xla/": "tensorflow/compiler/xla/"}


def _generated_file(proto: str) -> Path:
    """The installed `*_pb2.py` generated from `proto` (a path such as
    tensorflow/core/framework/tensor.proto), found without importing its package."""
    for prefix, moved in _MOVED.items():
        if proto.startswith(prefix):
            proto = moved + proto.removeprefix(prefix)
    top, _, rest = proto.partition("/")
    spec = importlib.util.find_spec(top)  # a top-level name: its package is not run
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    relative = rest.removesuffix(".proto") + "_pb2.py"
    for location in locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            return candidate
    raise ProtosMissing(f"{proto} is not installed ({relative} under {top}/); {INSTALL_HINT}")


def serialized_descriptor(proto: str) -> bytes:
    """The serialized FileDescriptorProto that `proto`'s generated module adds to the
    default pool (its `AddSerializedFile(b'...')` literal), read without running it."""
    path = _generated_file(proto)
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, bytes)
        ):
            return node.args[0].value
    raise ProtosMissing(f"{path} holds no serialized descriptor of {proto}")


def _add(pool: descriptor_pool.DescriptorPool, proto: str, added: set[str]) -> None:
    """Add `proto` to `pool`, its dependencies first."""
    if proto in added:
        return
    from google.protobuf import descriptor_pb2

    data = serialized_descriptor(proto)
    for dependency in descriptor_pb2.FileDescriptorProto.FromString(data).dependency:
        _add(pool, dependency, added)
    pool.AddSerializedFile(data)
    added.add(proto)


@cache
def serving_messages() -> ServingMessages:
    """The messages, built once per process; ProtosMissing if a package is missing."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    for proto in _ROOTS:
        _add(pool, proto, added)

    def message(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    data_type = pool.FindEnumTypeByName("tensorflow.DataType")
    return ServingMessages(
        PredictRequest=message("tensorflow.serving.PredictRequest"),
        PredictResponse=message("tensorflow.serving.PredictResponse"),
        GetModelMetadataRequest=message("tensorflow.serving.GetModelMetadataRequest"),
        GetModelMetadataResponse=message("tensorflow.serving.GetModelMetadataResponse"),
        SignatureDefMap=message("tensorflow.serving.SignatureDefMap"),
        TensorProto=message("tensorflow.TensorProto"),
        ClassificationRequest=message("tensorflow.serving.ClassificationRequest"),
        ClassificationResponse=message("tensorflow.serving.ClassificationResponse"),
        RegressionRequest=message("tensorflow.serving.RegressionRequest"),
        RegressionResponse=message("tensorflow.serving.RegressionResponse"),
        MultiInferenceRequest=message("tensorflow.serving.MultiInferenceRequest"),
        MultiInferenceResponse=message("tensorflow.serving.MultiInferenceResponse"),
        GetModelStatusRequest=message("tensorflow.serving.GetModelStatusRequest"),
        GetModelStatusResponse=message("tensorflow.serving.GetModelStatusResponse"),
        Example=message("tensorflow.Example"),
        data_types={value.name: value.number for value in data_type.values},
    )
