"""What a model process says, checked before anything uses it (the process is
untrusted: service.scoring.process): its description of saved_model.pb's graphs (for
service.domain.model_ops) or of model.onnx (for service.domain.onnx_rules), its
signatures (with their method names and tensor names, kept in the database and shown by
the API), and the outputs of each call (the signature's names, dtypes and shapes). Every
failure is a WireError. Also how much a call's answer may hold, so that no more is read
(`answer_limits`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from service.domain import onnx_rules
from service.domain.model_ops import ATTRS_OF_INTEREST, Graph, Node, forbidden_op
from service.domain.signature import PREDICT_METHOD, SignatureInfo, TensorInfo
from service.scoring import model_wire
from service.scoring.model_wire import DTYPES, MAX_BODY, WireError


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WireError(f"{what}: a list of strings is expected")
    return tuple(value)


def _nodes(value: Any, *, inputs: bool) -> tuple[Node, ...]:
    if not isinstance(value, list):
        raise WireError("nodes: a list is expected")
    nodes = []
    for n in value:
        if not isinstance(n, dict) or not isinstance(n.get("name"), str):
            raise WireError("a node without a name")
        if not isinstance(n.get("op"), str):
            raise WireError(f"node {n['name']!r}: no op")
        attrs = n.get("attrs", {})
        if not isinstance(attrs, dict) or not all(isinstance(v, str) for v in attrs.values()):
            raise WireError(f"node {n['name']!r}: attrs must be strings")
        nodes.append(
            Node(
                name=n["name"],
                op=n["op"],
                inputs=_strings(n.get("inputs", []), "inputs") if inputs else (),
                calls=_strings(n.get("calls", []), "calls"),
                attrs={k: v for k, v in attrs.items() if k in ATTRS_OF_INTEREST},
            )
        )
    return tuple(nodes)


def graphs_from_json(value: Any) -> list[Graph]:
    """The model process's description of saved_model.pb, checked."""
    if not isinstance(value, list) or not value:
        raise WireError("graph: a list of meta graphs is expected")
    graphs = []
    for g in value:
        if not isinstance(g, dict) or not isinstance(g.get("functions"), dict):
            raise WireError("graph: meta graphs with nodes and functions are expected")
        graphs.append(
            Graph(
                nodes=_nodes(g.get("nodes"), inputs=True),
                functions={
                    str(name): _nodes(nodes, inputs=False) for name, nodes in g["functions"].items()
                },
                roots=_strings(g.get("roots", []), "roots"),
                object_functions=_strings(g.get("object_functions", []), "object_functions"),
            )
        )
    return graphs


def refusal(header: Mapping[str, Any]) -> str | None:
    """Why the model the process described may not be loaded (None: it may): a
    SavedModel's operations (service.domain.model_ops), an ONNX model's domains, external
    data and types (service.domain.onnx_rules)."""
    if header.get("format") == "onnx":
        try:
            described = onnx_rules.description_from_json(header.get("onnx"))
        except ValueError as e:
            raise WireError(str(e)) from e
        return onnx_rules.onnx_refusal(described, DTYPES)
    found = forbidden_op(graphs_from_json(header.get("graph")))
    return None if found is None else found.message()


def _tensor_info(value: Any) -> TensorInfo:
    if not isinstance(value, dict):
        raise WireError("signature: tensors must be objects")
    name, dtype, shape = value.get("name"), value.get("dtype"), value.get("shape")
    if not isinstance(name, str) or not name or len(name) > 256:
        raise WireError("signature: a tensor without a name")
    if not isinstance(dtype, str) or not dtype.isidentifier() or len(dtype) > 32:
        raise WireError(f"signature: tensor {name!r} has no dtype")
    if shape is not None and not (
        isinstance(shape, list)
        and len(shape) <= model_wire.MAX_DIMS
        and all(d is None or (type(d) is int and d >= 0) for d in shape)
    ):
        raise WireError(f"signature: tensor {name!r} has no valid shape")
    tensor = value.get("tensor_name", "")
    if not isinstance(tensor, str) or len(tensor) > 1024:
        raise WireError(f"signature: tensor {name!r} has a tensor name that is not a string")
    return TensorInfo(name, dtype, None if shape is None else tuple(shape), tensor)


def signatures_from_json(value: Any) -> dict[str, SignatureInfo]:
    """The model process's signatures, checked (they go to the database and the API)."""
    if not isinstance(value, dict) or len(value) > 256:
        raise WireError("signatures: an object of at most 256 signatures is expected")
    signatures = {}
    for name, sig in value.items():
        if not isinstance(sig, dict) or len(name) > 256:
            raise WireError("signatures: each signature must be an object")
        inputs = sig.get("inputs")
        outputs = sig.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise WireError(f"signature {name!r}: inputs and outputs are expected")
        if len(inputs) > 1024 or len(outputs) > 1024:
            raise WireError(f"signature {name!r}: too many tensors")
        method = sig.get("method_name", PREDICT_METHOD)
        if not isinstance(method, str) or len(method) > 256:
            raise WireError(f"signature {name!r}: method_name is not a string")
        ins = [_tensor_info(t) for t in inputs]
        outs = [_tensor_info(t) for t in outputs]
        signatures[name] = SignatureInfo(
            name, {t.name: t for t in ins}, {t.name: t for t in outs}, method or PREDICT_METHOD
        )
    return signatures


_OBJECT = np.dtype(object)


def _expected_dtype(info: TensorInfo) -> np.dtype[Any] | None:
    """The dtype an output arrives in (None: any, a dtype that cannot cross)."""
    if info.dtype == "string":
        return _OBJECT
    return np.dtype(info.dtype) if info.dtype in DTYPES else None


def check_outputs(
    signature: SignatureInfo, outputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The outputs, if they are the signature's, each of its dtype and shape."""
    if outputs.keys() != signature.outputs.keys():
        raise WireError(
            f"outputs {sorted(outputs)} for signature '{signature.name}', whose outputs are "
            f"{sorted(signature.outputs)}"
        )
    for name, array in outputs.items():
        info = signature.outputs[name]
        expected = _expected_dtype(info)
        if expected is not None and array.dtype != expected:
            got = "string" if array.dtype == _OBJECT else array.dtype.name
            raise WireError(f"output {name!r} of dtype {got}, not {info.dtype}")
        if info.shape is not None and (
            len(info.shape) != array.ndim
            or any(e is not None and e != g for e, g in zip(info.shape, array.shape, strict=True))
        ):
            raise WireError(f"output {name!r} of shape {list(array.shape)}, not {info.describe()}")
    return outputs


# What an answer's header may hold beyond its tensors' list; an error's message is cut
# at 4 KiB by the model process.
_HEADER_SLACK = 8 * 1024


def _most_bytes(info: TensorInfo, rows: int | None) -> int | None:
    """The most bytes an output of `info` can hold in an answer for `rows` instances (an
    open first dimension is the rows), None when the signature does not bound it."""
    expected = _expected_dtype(info)
    if expected is None or expected == _OBJECT or info.shape is None:
        return None
    size = expected.itemsize
    for i, d in enumerate(info.shape):
        if d is not None:
            size *= d
        elif i == 0 and rows is not None:
            size *= rows
        else:
            return None
    return size


def answer_limits(signature: SignatureInfo, rows: int | None) -> tuple[int, int]:
    """The largest header and body an answer to a call of `signature` on `rows` instances
    can have: the outputs' names and dimensions, and their bytes as the signature gives
    them (strings and open dimensions past the first leave the body at the wire's own
    limit). The answer is read no further."""
    header = _HEADER_SLACK
    body: int | None = 0
    for info in signature.outputs.values():
        header += 2 + len(info.name.encode()) + 2 + 8 * model_wire.MAX_DIMS + 8
        most = _most_bytes(info, rows)
        body = None if most is None or body is None else body + most
    return header, MAX_BODY if body is None else min(body, MAX_BODY)
