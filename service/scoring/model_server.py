"""The model process: one deployment's model (a SavedModel, or an ONNX model through
onnx_model.py beside this file), loaded and called in a process of its own, inside the
sandbox (service.scoring.process starts and supervises it).

This file is the whole program of that process, run as a script (`python -I
model_server.py --model DIR --fd N [--fd N ...]`): it imports the standard library, numpy
and TensorFlow, nothing of the platform, whose files are not visible in the sandbox. The
scoring service runs it by its path and does not import it (its tests do, for `Model`).

The process talks over the connected Unix sockets it inherits (`--fd`; socket pairs, so
there is no path to connect to, and nothing listens), in the frames of model_wire.py
beside this file, which it loads by its path (the sandbox shows the process these three
files: this one, model_wire.py and onnx_model.py).

The conversation, on the first socket:

1. scoring service: `{"op": "describe", "attrs": [...]}`; model process: `{"op": "graph",
   "graph": [...]}`, what service.domain.model_ops needs to know of saved_model.pb (parsed,
   not loaded: no model code has run yet), or for an ONNX model `{"op": "graph", "format":
   "onnx", "onnx": {...}}`, what service.domain.onnx_rules needs to know of model.onnx;
2. scoring service: `{"op": "load"}` (or it closes the sockets: the model is refused);
   model process: `{"op": "ready", "signatures": {...}}` once the model is loaded and its
   `serving_default` (a Predict signature) called once with zeros, or `{"op": "failed",
   "error": "..."}`. Each signature carries its SignatureDef's `method_name` and, for each
   input and output, the graph's `tensor_name` (read from saved_model.pb).

Then on every socket, one call at a time each: `{"op": "call", "signature": name}` with
the input arrays, answered `{"op": "result"}` with the output arrays or `{"op": "error",
"kind": "input" | "model", "message": ...}`. When a socket closes (the scoring service
stopped, or died) the process exits.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np


def _beside(filename: str) -> ModuleType:
    """A file beside this one, loaded by its path (the model process runs with `python -I`,
    whose import path holds nothing of the platform)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"dlaas_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The wire format, loaded by its path here too when a test imports this file: this file
# imports nothing of the platform wherever it runs.
wire = _beside("model_wire.py")


def _tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return importlib.import_module("tensorflow")


def _node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":", 1)[0]


def _calls(attrs: Any) -> list[str]:
    """The functions named by function-valued attributes (and those nested in them)."""
    found: list[str] = []
    for value in attrs.values():
        kind = value.WhichOneof("value")
        funcs = [value.func] if kind == "func" else list(value.list.func) if kind == "list" else []
        for func in funcs:
            found.append(func.name)
            found += _calls(func.attr)
    return found


def _node(node: Any, attrs: Sequence[str], *, inputs: bool) -> dict[str, Any]:
    return {
        "name": node.name,
        "op": node.op,
        "inputs": [_node_name(i) for i in node.input] if inputs else [],
        "calls": _calls(node.attr),
        "attrs": {
            a: node.attr[a].s.decode(errors="replace")
            for a in attrs
            if a in node.attr and node.attr[a].WhichOneof("value") == "s"
        },
    }


def _saved_model(model_dir: Path) -> Any:
    """saved_model.pb (the file TensorFlow's loader reads first), parsed with TensorFlow's
    protocol buffers."""
    _tensorflow()
    saved_model_pb2 = importlib.import_module("tensorflow.core.protobuf.saved_model_pb2")
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    return proto


def describe_graph(model_dir: Path, attrs: Sequence[str]) -> list[dict[str, Any]]:
    """What service.domain.model_ops checks, of every meta graph in saved_model.pb (the
    file TensorFlow's loader reads first), parsed with TensorFlow's protocol buffers."""
    proto = _saved_model(model_dir)
    graphs = []
    for meta in proto.meta_graphs:
        roots = [
            t.name
            for sig in meta.signature_def.values()
            for tensors in (sig.inputs, sig.outputs)
            for t in tensors.values()
        ]
        roots += [v for c in meta.collection_def.values() for v in c.node_list.value]
        library = meta.graph_def.library
        graphs.append(
            {
                "nodes": [_node(n, attrs, inputs=True) for n in meta.graph_def.node],
                "functions": {
                    f.signature.name: [_node(n, attrs, inputs=False) for n in f.node_def]
                    for f in library.function
                },
                "roots": roots,
                "object_functions": list(meta.object_graph_def.concrete_functions),
            }
        )
    return graphs


PREDICT_METHOD = "tensorflow/serving/predict"


def signature_defs(model_dir: Path) -> dict[str, dict[str, Any]]:
    """Each SignatureDef of saved_model.pb's first meta graph (the one loaded): its
    method_name and the graph's tensor name of each input and output key."""
    proto = _saved_model(model_dir)
    if not proto.meta_graphs:
        return {}
    return {
        name: {
            "method_name": sig.method_name or PREDICT_METHOD,
            "inputs": {k: t.name for k, t in sig.inputs.items()},
            "outputs": {k: t.name for k, t in sig.outputs.items()},
        }
        for name, sig in proto.meta_graphs[0].signature_def.items()
    }


def _tensor_info(name: str, spec: Any, tensor: str) -> dict[str, Any]:
    shape = None if spec.shape.rank is None else spec.shape.as_list()
    info = {"name": name, "dtype": spec.dtype.name, "shape": shape}
    if tensor:
        info["tensor_name"] = tensor
    return info


def _describe(name: str, function: Any, definition: Mapping[str, Any]) -> dict[str, Any]:
    """The signature `name` as the scoring service keeps it: inputs and outputs (dtype,
    shape, and the tensor names of its SignatureDef), and the SignatureDef's method."""
    args, kwargs = function.structured_input_signature
    if args:
        raise ValueError(f"signature '{name}' takes positional inputs; signatures name them")
    outputs = function.structured_outputs
    if not isinstance(outputs, Mapping):
        raise ValueError(f"signature '{name}' does not return named outputs")
    ins, outs = definition.get("inputs", {}), definition.get("outputs", {})
    return {
        "method_name": definition.get("method_name", PREDICT_METHOD),
        "inputs": [_tensor_info(n, s, ins.get(n, "")) for n, s in sorted(kwargs.items())],
        "outputs": [_tensor_info(n, s, outs.get(n, "")) for n, s in sorted(outputs.items())],
    }


def _example(info: Mapping[str, Any]) -> np.ndarray:
    """One instance of zeros (empty strings) in the shape of `info`, open dimensions 1."""
    shape = tuple(1 if d is None else d for d in (info["shape"] or (1,)))
    if info["dtype"] == "string":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=np.dtype(info["dtype"]))


class InputRefused(ValueError):
    """The model refused the inputs (InvalidArgumentError and the like)."""


class Model:
    """The SavedModel's signatures, described and callable with numpy arrays."""

    def __init__(self, path: Path) -> None:
        self._tf = _tensorflow()
        self._model = self._tf.saved_model.load(str(path))
        self._functions: dict[str, Any] = dict(self._model.signatures)
        definitions = signature_defs(path)
        self.signatures = {
            n: _describe(n, f, definitions.get(n, {})) for n, f in sorted(self._functions.items())
        }
        # Signatures called without TensorFlow's binding of keyword arguments (FlatCall),
        # once warm_up has seen them answer as the structured call does.
        self._flat: dict[str, FlatCall] = {}

    def call(self, signature: str, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = self._tf
        function = self._functions.get(signature)
        if function is None:
            raise InputRefused(f"the model has no signature '{signature}'")
        flat = self._flat.get(signature)
        try:
            outputs = flat(tensors) if flat is not None else None
            if outputs is None:
                outputs = function(**{n: tf.convert_to_tensor(t) for n, t in tensors.items()})
        except (tf.errors.InvalidArgumentError, TypeError, ValueError) as e:
            message = getattr(e, "message", None) or str(e)
            raise InputRefused((message.strip().splitlines() or [""])[0]) from e
        return {n: t.numpy() for n, t in outputs.items()}

    def warm_up(self, signature: str) -> None:
        """Call the signature once with zeros, so the first request does not pay for the
        first call (and a model that cannot answer fails to deploy instead); then call it
        flat (FlatCall) and keep that way of calling it if it answers the same."""
        inputs = {t["name"]: _example(t) for t in self.signatures[signature]["inputs"]}
        expected = self.call(signature, inputs)
        flat = FlatCall.of(self._tf, self._functions[signature])
        if flat is None:
            return
        try:
            outputs = flat(inputs)
            got = None if outputs is None else {n: t.numpy() for n, t in outputs.items()}
        except Exception:
            return
        if got is not None and _same(got, expected):
            self._flat[signature] = flat


def _same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind in "fc")
        for k in a
    )


class FlatCall:
    """A signature called with its tensors in the function's own order, past TensorFlow's
    binding and checking of keyword arguments (a third of a small model's call). Only for
    inputs of the signature's dtype and shape; for any other it answers None, and the
    signature is called as usual (whose error the caller gets)."""

    def __init__(self, tf: Any, function: Any, order: list[str], specs: dict[str, Any]) -> None:
        self._tf = tf
        self._call = function._call_flat
        self._captured = function.captured_inputs
        self._order = order
        self._expect = {
            name: (
                np.dtype(spec.dtype.as_numpy_dtype),
                None if spec.shape.rank is None else tuple(spec.shape.as_list()),
            )
            for name, spec in specs.items()
        }

    @classmethod
    def of(cls, tf: Any, function: Any) -> FlatCall | None:
        """The flat call of `function`, if it has one this TensorFlow can make: every input
        a plain tensor, named, and outputs by name."""
        if not callable(getattr(function, "_call_flat", None)):
            return None
        args, kwargs = function.structured_input_signature
        function_type = getattr(function, "function_type", None)
        if args or function_type is None or not isinstance(function.structured_outputs, Mapping):
            return None
        order = list(function_type.parameters)
        if sorted(order) != sorted(kwargs) or not all(
            type(spec) is tf.TensorSpec and spec.dtype != tf.string for spec in kwargs.values()
        ):
            return None
        return cls(tf, function, order, kwargs)

    def __call__(self, tensors: Mapping[str, np.ndarray]) -> Any:
        if tensors.keys() != self._expect.keys():
            return None
        for name, (dtype, shape) in self._expect.items():
            value = tensors[name]
            if value.dtype != dtype or not _fits(shape, value.shape):
                return None
        convert = self._tf.convert_to_tensor
        return self._call([convert(tensors[name]) for name in self._order], self._captured)


def _fits(shape: tuple[int | None, ...] | None, actual: tuple[int, ...]) -> bool:
    """Whether an array of shape `actual` fits a spec's `shape` (None: any)."""
    if shape is None:
        return True
    if len(shape) != len(actual):
        return False
    return all(d is None or d == a for d, a in zip(shape, actual, strict=True))


def _first_line(error: BaseException) -> str:
    text = getattr(error, "message", None) or str(error)
    return f"{type(error).__name__}: {(text.strip().splitlines() or [''])[0]}"[:600]


def _serve(model: Any, sock: socket.socket) -> None:
    try:
        while True:
            header, body = wire.receive(sock)
            if header.get("op") != "call":
                raise wire.WireError(f"unexpected message {header.get('op')!r}")
            try:
                outputs = model.call(str(header.get("signature")), wire.tensors_of(header, body))
                frame = wire.encode_result(outputs)
            except InputRefused as e:
                frame = wire.encode_error("input", str(e))
            except Exception as e:
                frame = wire.encode_error("model", _first_line(e))
            wire.send(sock, frame)
    except (wire.Closed, OSError, wire.WireError):
        pass
    os._exit(0)  # the scoring service is gone, or broke the protocol: nothing to serve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve one model over inherited sockets.")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--fd", type=int, action="append", required=True)
    args = parser.parse_args(argv)
    sockets = [socket.socket(fileno=fd) for fd in args.fd]
    control = sockets[0]
    # A directory with model.onnx is an ONNX model (onnx_model.py); else a SavedModel.
    onnx = _beside("onnx_model.py") if (args.model / "model.onnx").is_file() else None
    try:
        header, _ = wire.receive(control)
        attrs = [a for a in header.get("attrs", []) if isinstance(a, str)]
        try:
            if onnx is not None:
                described = {"op": "graph", "format": "onnx", "onnx": onnx.describe(args.model)}
            else:
                described = {"op": "graph", "graph": describe_graph(args.model, attrs)}
        except Exception as e:
            wire.send(control, wire.encode({"op": "failed", "error": _first_line(e)}))
            return 1
        wire.send(control, wire.encode(described))
        header, _ = wire.receive(control)
        if header.get("op") != "load":
            return 0
    except (wire.Closed, OSError, wire.WireError):
        return 0
    try:
        model = onnx.OnnxModel(args.model, InputRefused) if onnx is not None else Model(args.model)
        default = model.signatures.get("serving_default")
        # Classify and Regress signatures take serialized tf.Examples, for which zeros are
        # no instance: only Predict signatures (an ONNX model's one) are warmed up.
        if default is not None and default["method_name"] == PREDICT_METHOD:
            model.warm_up("serving_default")
    except Exception as e:
        wire.send(control, wire.encode({"op": "failed", "error": _first_line(e)}))
        return 1
    wire.send(control, wire.encode({"op": "ready", "signatures": model.signatures}))
    threads = [
        threading.Thread(target=_serve, args=(model, s), name=f"serve-{i}", daemon=True)
        for i, s in enumerate(sockets)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
