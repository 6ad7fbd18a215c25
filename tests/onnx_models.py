"""ONNX models the scoring tests deploy, built here with `onnx.helper` (no PyTorch needed):
a linear regression with a symbolic batch dimension, and models the platform must refuse
(an operator of a custom domain, tensor data kept outside the model's directory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

W = np.array([[3.0, 1.0], [-2.0, 0.5]], dtype=np.float32)
B = np.array([0.5, -1.0], dtype=np.float32)
OPSET = [helper.make_opsetid("", 17)]


def _linear_graph(initializers: list[TensorProto], nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
    return helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializers,
    )


def linear() -> onnx.ModelProto:
    """y = x @ W + B, x float32 [batch, 2]."""
    graph = _linear_graph(
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
            helper.make_node("Add", ["xw", "B"], ["y"], name="add"),
        ],
    )
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="dlaas-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def custom_domain() -> onnx.ModelProto:
    """The linear model with one operator of a custom domain (`com.example.ops`)."""
    model = linear()
    model.graph.node.append(
        helper.make_node("Leak", ["y"], ["z"], name="leak", domain="com.example.ops")
    )
    model.opset_import.append(helper.make_opsetid("com.example.ops", 1))
    return model


def external_outside() -> onnx.ModelProto:
    """The linear model whose W is said to live in `../../secret.bin`."""
    model = linear()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../secret.bin"), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    return model


def save(model: onnx.ModelProto, directory: Path) -> Path:
    """`directory/model.onnx` (the form a training's results hold under `model/`)."""
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "model.onnx"))
    return directory
