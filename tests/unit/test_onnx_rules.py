"""What an ONNX model must be to be deployed (service.domain.onnx_rules), as a table over
descriptions, and the model process's description of real `model.onnx` files
(service.scoring.onnx_model.describe): custom domains, external data, subgraphs, local
functions, symbolic batch dimensions."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.domain.onnx_rules import (
    OnnxDescription,
    OnnxNode,
    OnnxTensor,
    description_from_json,
    onnx_refusal,
)
from service.scoring.model_wire import DTYPES

X = OnnxTensor("x", "float32", (None, 2))
Y = OnnxTensor("y", "float32", (None, 2))


def model(
    *nodes: OnnxNode,
    functions: frozenset[str] = frozenset(),
    locations: tuple[str, ...] = (),
    inputs: tuple[OnnxTensor, ...] = (X,),
    outputs: tuple[OnnxTensor, ...] = (Y,),
) -> OnnxDescription:
    return OnnxDescription(nodes, functions, locations, inputs, outputs)


MATMUL = OnnxNode("", "MatMul", "graph, node mm")


@pytest.mark.parametrize(
    ("description", "refused"),
    [
        (model(MATMUL), None),
        (model(MATMUL, OnnxNode("ai.onnx", "Relu", "graph, node r")), None),
        (model(OnnxNode("ai.onnx.ml", "TreeEnsembleRegressor", "graph, node t")), None),
        (
            model(MATMUL, OnnxNode("com.example.ops", "Leak", "graph, node leak")),
            "the model uses the operator Leak of the custom domain 'com.example.ops' "
            "(graph, node leak)",
        ),
        # ONNX Runtime's own contrib operators are not ONNX's: refused as any other domain.
        (
            model(OnnxNode("com.microsoft", "FusedMatMul", "graph, node f")),
            "custom domain 'com.microsoft'",
        ),
        # A node inside a subgraph is found where it is.
        (
            model(OnnxNode("my.ops", "X", "graph > node if.then_branch[0], node x")),
            "(graph > node if.then_branch[0], node x)",
        ),
        # A call of one of the model's own local functions is not a custom operator.
        (
            model(
                OnnxNode("local.fn", "Block", "graph, node b"), functions=frozenset({"local.fn"})
            ),
            None,
        ),
        (model(MATMUL, locations=("weights.bin",)), None),
        (model(MATMUL, locations=("data/weights.bin",)), None),
        (model(MATMUL, locations=("../secret.bin",)), "keeps tensor data in '../secret.bin'"),
        (model(MATMUL, locations=("/etc/passwd",)), "keeps tensor data in '/etc/passwd'"),
        (model(MATMUL, locations=("a/../../b",)), "outside its directory"),
        (model(MATMUL, locations=("",)), "outside its directory"),
        (model(MATMUL, locations=("c:\\w.bin",)), "outside its directory"),
        (model(MATMUL, locations=("w\x00.bin",)), "outside its directory"),
        (model(MATMUL, inputs=()), "has no inputs to score"),
        (model(MATMUL, outputs=()), "has no outputs"),
        (
            model(MATMUL, inputs=(OnnxTensor("x", "bfloat16", (None,)),)),
            "the model's input 'x' is of type bfloat16",
        ),
        (
            model(MATMUL, outputs=(OnnxTensor("seq", "sequence_type", None),)),
            "the model's output 'seq' is of type sequence_type",
        ),
        (model(MATMUL, inputs=(OnnxTensor("s", "string", (None,)),)), None),
    ],
)
def test_what_an_onnx_model_may_be(description: OnnxDescription, refused: str | None) -> None:
    found = onnx_refusal(description, DTYPES)
    if refused is None:
        assert found is None
    else:
        assert found is not None and refused in found, found


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([], "an object is expected"),
        ({"nodes": "x"}, "nodes is expected"),
        ({"nodes": [["", "Add"]]}, "[domain, op_type, where]"),
        ({"nodes": [[1, "Add", "g"]]}, "a string is expected"),
        ({"nodes": [], "inputs": [{"name": "x", "dtype": "float32", "shape": [-1]}]}, "shapes"),
        ({"nodes": [], "external_locations": "x", "inputs": [], "outputs": []}, "lists of"),
        ({"nodes": [], "inputs": None, "outputs": []}, "onnx inputs"),
    ],
)
def test_a_description_that_breaks_the_form_is_refused(value: Any, error: str) -> None:
    with pytest.raises(ValueError) as e:
        description_from_json(value)
    assert error in str(e.value)


onnx = pytest.importorskip("onnx", reason="install the onnx extra")


def test_the_model_process_describes_real_models(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    from service.scoring import onnx_model
    from tests import onnx_models

    linear = onnx_model.describe(onnx_models.save(onnx_models.linear(), tmp_path / "linear"))
    # Named as the graph names them (the tensor names TF Serving's metadata shows too).
    x = {"name": "x", "dtype": "float32", "shape": [None, 2], "tensor_name": "x"}
    assert linear["inputs"] == [x]
    assert linear["outputs"] == [{**x, "name": "y", "tensor_name": "y"}]
    assert onnx_refusal(description_from_json(linear), DTYPES) is None

    custom = onnx_model.describe(onnx_models.save(onnx_models.custom_domain(), tmp_path / "c"))
    found = onnx_refusal(description_from_json(custom), DTYPES)
    assert found is not None and "Leak of the custom domain 'com.example.ops'" in found

    outside = onnx_model.describe(onnx_models.save(onnx_models.external_outside(), tmp_path / "e"))
    assert outside["external_locations"] == ["../../secret.bin"]
    found = onnx_refusal(description_from_json(outside), DTYPES)
    assert found is not None and "'../../secret.bin', outside its directory" in found

    # A custom operator hidden in an If's branch, and a model-local function.
    branch = helper.make_graph(
        [helper.make_node("Hidden", ["x"], ["out"], domain="my.ops", name="hidden")],
        "then",
        [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["out2"], name="same")],
        "else",
        [],
        [helper.make_tensor_value_info("out2", TensorProto.FLOAT, [1])],
    )
    block = helper.make_function(
        "local.fn",
        "Block",
        ["a"],
        ["b"],
        [helper.make_node("Relu", ["a"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Block", ["x"], ["c"], domain="local.fn", name="call"),
            helper.make_node(
                "If", ["cond"], ["y"], then_branch=branch, else_branch=other, name="if"
            ),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    nested = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local.fn", 1)],
        functions=[block],
    )
    described = onnx_model.describe(onnx_models.save(nested, tmp_path / "nested"))
    assert described["local_function_domains"] == ["local.fn"]
    found = onnx_refusal(description_from_json(described), DTYPES)
    assert found is not None
    assert (
        "Hidden of the custom domain 'my.ops' (graph > node if.then_branch[0], node hidden)"
        in found
    )


PLATFORM = Path(__file__).resolve().parents[2]


def test_the_platform_never_unpickles_a_model() -> None:
    """No pickled PyTorch model (`torch.load`) nor any pickle is ever loaded by the platform:
    no call of torch.load, pickle.load(s), joblib.load or numpy.load(allow_pickle=True) in
    its source."""
    found = []
    for package in ("service", "worker", "composition", "dlaas"):
        for path in sorted((PLATFORM / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = node.func.value
                name = f"{owner.id if isinstance(owner, ast.Name) else '?'}.{node.func.attr}"
                pickled = name in {"torch.load", "pickle.load", "pickle.loads", "joblib.load"}
                pickled |= name == "np.load" and any(k.arg == "allow_pickle" for k in node.keywords)
                if pickled:
                    found.append(f"{path.relative_to(PLATFORM)}:{node.lineno} {name}")
    assert found == []


def test_the_model_process_session_does_not_spin_between_operators(tmp_path: Path) -> None:
    """The model process shares the cores with the API process that feeds it: its ONNX
    Runtime session's operator threads sleep between operators instead of spinning."""
    from service.scoring import onnx_model
    from tests import onnx_models

    loaded = onnx_model.OnnxModel(onnx_models.save(onnx_models.linear(), tmp_path), ValueError)
    options = loaded._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    out = loaded.call(onnx_model.SIGNATURE, {"x": np.ones((3, 2), np.float32)})  # it answers
    assert out["y"].shape == (3, 2)
