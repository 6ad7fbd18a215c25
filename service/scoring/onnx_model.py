"""The model process's ONNX half: `model.onnx` described (parsed with the `onnx` package's
protocol buffers, nothing run) and then served with ONNX Runtime.

Like model_server.py, whose process loads this file by its path when the model directory
holds `model.onnx`, it imports the standard library, numpy, `onnx` and `onnxruntime`,
nothing of the platform. The scoring service never imports it.

The graph is one signature, `serving_default`: its inputs (the graph's inputs that are not
initializers) and outputs, by name, with their element types in numpy's names and their
shapes (a symbolic or unknown dimension is None, as a SavedModel's open dimensions are).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILE = "model.onnx"
SIGNATURE = "serving_default"
# The graph is called as TensorFlow Serving's Predict signatures are.
PREDICT_METHOD = "tensorflow/serving/predict"


def _onnx() -> Any:
    return importlib.import_module("onnx")


def _dtype(elem_type: int) -> str:
    onnx = _onnx()
    if elem_type == onnx.TensorProto.STRING:
        return "string"
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name)
    except (KeyError, TypeError, ValueError):
        return str(onnx.TensorProto.DataType.Name(elem_type)).lower()


def _tensor(value_info: Any) -> dict[str, Any]:
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        return {
            "name": value_info.name,
            "dtype": str(kind or "unknown"),
            "shape": None,
            "tensor_name": value_info.name,
        }
    tensor = value_info.type.tensor_type
    shape = None
    if tensor.HasField("shape"):
        shape = [
            d.dim_value if d.WhichOneof("value") == "dim_value" and d.dim_value > 0 else None
            for d in tensor.shape.dim
        ]
    return {
        "name": value_info.name,
        "dtype": _dtype(tensor.elem_type),
        "shape": shape,
        "tensor_name": value_info.name,
    }


def _graphs(graph: Any, where: str) -> Iterator[tuple[Any, str]]:
    """`graph` and every subgraph of its nodes' attributes (If, Loop, Scan), with where
    each is."""
    yield graph, where
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.HasField("g") else []
            subgraphs += list(attr.graphs)
            for i, sub in enumerate(subgraphs):
                yield from _graphs(
                    sub, f"{where} > node {node.name or node.op_type}.{attr.name}[{i}]"
                )


def _external(tensors: Any) -> Iterator[str]:
    onnx = _onnx()
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            yield entries.get("location", "")


def describe(model_dir: Path) -> dict[str, Any]:
    """What service.domain.onnx_rules checks of the model, read without running it."""
    onnx = _onnx()
    model = onnx.load(str(model_dir / MODEL_FILE), load_external_data=False)
    nodes: list[list[str]] = []
    locations: list[str] = []
    for graph, where in _graphs(model.graph, "graph"):
        nodes += [[n.domain, n.op_type, f"{where}, node {n.name or n.op_type}"] for n in graph.node]
        locations += _external(graph.initializer)
        locations += _external(s.values for s in graph.sparse_initializer)
    for function in model.functions:
        where = f"function {function.domain}.{function.name}"
        nodes += [
            [n.domain, n.op_type, f"{where}, node {n.name or n.op_type}"] for n in function.node
        ]
    initializers = {t.name for t in model.graph.initializer}
    return {
        "nodes": nodes,
        "local_function_domains": sorted({f.domain for f in model.functions}),
        "external_locations": locations,
        "inputs": [_tensor(v) for v in model.graph.input if v.name not in initializers],
        "outputs": [_tensor(v) for v in model.graph.output],
    }


def _strings(array: np.ndarray) -> np.ndarray:
    """Strings as ONNX Runtime takes them (str objects), from the wire's bytes."""
    flat = [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]
    return np.array(flat, dtype=object).reshape(array.shape)


class OnnxModel:
    """An ONNX Runtime session on model.onnx, with model_server.Model's interface."""

    def __init__(self, model_dir: Path, input_error: type[Exception]) -> None:
        ort = importlib.import_module("onnxruntime")
        self._input_error = input_error
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # ONNX Runtime's operator threads spin between operators by default, holding the
        # cores a caller alone in its process would leave idle. Here the API process
        # needs them between calls (to read the next requests and answer these): with the
        # spin, the `scoring_onnx_b64` row's served rate was 22,300-26,700 predictions/s
        # in five runs, without it 24,800-29,900.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # A GPU where the process was given one (ONNX Runtime's CUDA build), else the CPU.
        providers = [
            p
            for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
            if p in ort.get_available_providers()
        ]
        self._session = ort.InferenceSession(
            str(model_dir / MODEL_FILE), sess_options=options, providers=providers
        )
        self._errors: tuple[type[BaseException], ...] = tuple(
            getattr(ort.capi.onnxruntime_pybind11_state, name)
            for name in ("InvalidArgument", "InvalidGraph", "Fail", "RuntimeException")
            if hasattr(ort.capi.onnxruntime_pybind11_state, name)
        )
        described = describe(model_dir)
        self._inputs = {t["name"]: t for t in described["inputs"]}
        self._outputs = [t["name"] for t in described["outputs"]]
        self.signatures = {
            SIGNATURE: {
                "inputs": sorted(described["inputs"], key=lambda t: t["name"]),
                "outputs": sorted(described["outputs"], key=lambda t: t["name"]),
                "method_name": PREDICT_METHOD,
            }
        }

    def call(self, signature: str, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if signature != SIGNATURE:
            raise self._input_error(f"the model has no signature '{signature}'")
        feed = {}
        for name, value in tensors.items():
            info = self._inputs.get(name)
            if info is None:
                raise self._input_error(f"the model has no input '{name}'")
            feed[name] = _strings(value) if info["dtype"] == "string" else value
        try:
            results = self._session.run(self._outputs, feed)
        except self._errors as e:
            raise self._input_error((str(e).strip().splitlines() or [""])[0]) from e
        return {name: np.asarray(value) for name, value in zip(self._outputs, results, strict=True)}

    def warm_up(self, signature: str) -> None:
        """One call with zeros (empty strings), open dimensions 1, as model_server.Model."""
        feed = {}
        for info in self.signatures[signature]["inputs"]:
            shape = tuple(1 if d is None else d for d in (info["shape"] or (1,)))
            if info["dtype"] == "string":
                feed[info["name"]] = np.full(shape, b"", dtype=object)
            else:
                feed[info["name"]] = np.zeros(shape, dtype=np.dtype(info["dtype"]))
        self.call(signature, feed)
