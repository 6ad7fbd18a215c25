"""What an ONNX model must be to be deployed. Pure rules over the model process's
description of `model.onnx` (parsed with the `onnx` package's protocol buffers inside the
sandbox, never executed before these rules pass); no ONNX here.

ONNX Runtime runs the operators of the standard domains itself. An operator of any other
domain (a "custom op") needs a library registered with the session, which the platform
never registers: such a model could not run, and a library loaded for it would be code the
tenant chose. So a node of a domain outside `STANDARD_DOMAINS` is refused at deploy, naming
the domain, the operator and where it is, unless the domain is one of the model's own
local functions (whose bodies are checked like the graph).

Initializers may keep their data in external files (`data_location: EXTERNAL`), named
relative to the model file. The model process sees its model directory only, but a
location that leaves it (absolute, `..`, a drive or a NUL) is refused by name all the same:
what a model may read is its directory, by construction and by rule.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

# The operator domains ONNX Runtime implements without a registered library: ONNX's own
# ("" and its alias "ai.onnx") and ONNX-ML's.
STANDARD_DOMAINS: frozenset[str] = frozenset({"", "ai.onnx", "ai.onnx.ml"})
# Bounds on what the description may hold (it comes from an untrusted process).
MAX_NODES = 1_000_000
MAX_LOCATIONS = 100_000


@dataclass(frozen=True)
class OnnxNode:
    """One operator use: its domain and type, and where it is (`graph`, a subgraph's path,
    or `function <domain>.<name>`)."""

    domain: str
    op_type: str
    where: str


@dataclass(frozen=True)
class OnnxTensor:
    name: str
    dtype: str
    shape: tuple[int | None, ...] | None


@dataclass(frozen=True)
class OnnxDescription:
    """What the model process read of `model.onnx`."""

    nodes: tuple[OnnxNode, ...]
    # Domains of the model's own local functions (ModelProto.functions).
    local_function_domains: frozenset[str]
    # The `location` of every initializer kept in an external file.
    external_locations: tuple[str, ...]
    inputs: tuple[OnnxTensor, ...]
    outputs: tuple[OnnxTensor, ...]


def _outside(location: str) -> bool:
    """Whether an external data location names a file outside the model's directory."""
    if not location or "\x00" in location or "\\" in location or ":" in location:
        return True
    path = PurePosixPath(location)
    return path.is_absolute() or any(part == ".." for part in path.parts)


def onnx_refusal(model: OnnxDescription, servable: Collection[str]) -> str | None:
    """Why the model cannot be deployed, or None when it can; `servable`: the dtypes (numpy's
    names) that cross between the scoring service and the model process."""
    for node in model.nodes:
        if node.domain in STANDARD_DOMAINS or node.domain in model.local_function_domains:
            continue
        return (
            f"the model uses the operator {node.op_type} of the custom domain "
            f"'{node.domain}' ({node.where}); only ONNX's standard domains "
            f"({', '.join(repr(d) for d in sorted(STANDARD_DOMAINS))}) can be served"
        )
    for location in model.external_locations:
        if _outside(location):
            return (
                f"the model keeps tensor data in '{location}', outside its directory; "
                "external data must be a file beside model.onnx"
            )
    if not model.inputs:
        return "the model's graph has no inputs to score"
    if not model.outputs:
        return "the model's graph has no outputs"
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        for tensor in tensors:
            if tensor.dtype not in servable:
                return (
                    f"the model's {kind} '{tensor.name}' is of type {tensor.dtype}, which "
                    "online scoring does not carry"
                )
    return None


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > 4096:
        raise ValueError(f"{what}: a string is expected")
    return value


def _tensors(value: object, what: str) -> tuple[OnnxTensor, ...]:
    if not isinstance(value, list) or len(value) > 1024:
        raise ValueError(f"{what}: a list of at most 1024 tensors is expected")
    out = []
    for t in value:
        if not isinstance(t, Mapping):
            raise ValueError(f"{what}: tensors must be objects")
        shape = t.get("shape")
        if shape is not None and not (
            isinstance(shape, list)
            and len(shape) <= 32
            and all(d is None or (type(d) is int and d >= 0) for d in shape)
        ):
            raise ValueError(f"{what}: tensor shapes must be lists of sizes or null")
        out.append(
            OnnxTensor(
                name=_text(t.get("name"), what),
                dtype=_text(t.get("dtype"), what),
                shape=None if shape is None else tuple(shape),
            )
        )
    return tuple(out)


def description_from_json(value: object) -> OnnxDescription:
    """The model process's description, checked (ValueError names what is wrong)."""
    if not isinstance(value, Mapping):
        raise ValueError("onnx: an object is expected")
    nodes = value.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise ValueError(f"onnx: a list of at most {MAX_NODES} nodes is expected")
    parsed_nodes = []
    for n in nodes:
        if not isinstance(n, Sequence) or isinstance(n, str) or len(n) != 3:
            raise ValueError("onnx: each node is [domain, op_type, where]")
        parsed_nodes.append(OnnxNode(*(_text(part, "onnx node") for part in n)))
    functions = value.get("local_function_domains", [])
    locations = value.get("external_locations", [])
    if not isinstance(functions, list) or not isinstance(locations, list):
        raise ValueError("onnx: lists of function domains and external locations expected")
    if len(locations) > MAX_LOCATIONS:
        raise ValueError(f"onnx: more than {MAX_LOCATIONS} external data locations")
    return OnnxDescription(
        nodes=tuple(parsed_nodes),
        local_function_domains=frozenset(_text(d, "onnx function domain") for d in functions),
        external_locations=tuple(_text(loc, "onnx external location") for loc in locations),
        inputs=_tensors(value.get("inputs"), "onnx inputs"),
        outputs=_tensors(value.get("outputs"), "onnx outputs"),
    )
