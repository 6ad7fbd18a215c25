"""Which operations a deployed model may not use (service.domain.model_ops), on graphs
described as data: the shapes TensorFlow gives a TF2 SavedModel (signature wrapper,
serving function, the saver's traced save and restore functions) and a TF1 one (the
saver's nodes in the graph itself, and an older one import_meta_graph left behind)."""

from __future__ import annotations

import pytest

from service.domain.model_ops import CHECKPOINT_OPS, DENIED_OPS, Graph, Node, forbidden_op


def tf2_graph(serve_ops: tuple[str, ...] = ("MatMul",), **changes: object) -> Graph:
    """A TF2 SavedModel as tf.saved_model.save writes it."""
    nodes = (
        Node("Variable", "VarHandleOp"),
        Node("serving_default_x", "Placeholder"),
        Node(
            "StatefulPartitionedCall",
            "StatefulPartitionedCall",
            inputs=("serving_default_x", "Variable"),
            calls=("__inference_signature_wrapper_7",),
        ),
        Node("saver_filename", "Placeholder"),
        Node(
            "StatefulPartitionedCall_1",
            "StatefulPartitionedCall",
            inputs=("saver_filename", "Variable"),
            calls=("__inference__traced_save_9",),
        ),
        Node(
            "StatefulPartitionedCall_2",
            "StatefulPartitionedCall",
            inputs=("saver_filename", "Variable"),
            calls=("__inference__traced_restore_11",),
        ),
    )
    functions = {
        "__inference_signature_wrapper_7": (
            Node("call", "StatefulPartitionedCall", calls=("__inference_serve_5",)),
        ),
        "__inference_serve_5": tuple(Node(f"n{i}", op) for i, op in enumerate(serve_ops)),
        "__inference__traced_save_9": (
            Node("SaveV2", "SaveV2"),
            Node("MergeV2Checkpoints", "MergeV2Checkpoints"),
        ),
        "__inference__traced_restore_11": (Node("RestoreV2", "RestoreV2"),),
    }
    values: dict[str, object] = {
        "nodes": nodes,
        "functions": functions,
        "roots": ("serving_default_x:0", "StatefulPartitionedCall:0"),
        "object_functions": ("__inference_signature_wrapper_7", "__inference_serve_5"),
    }
    values.update(changes)
    return Graph(**values)  # type: ignore[arg-type]


def test_a_plain_model_and_its_saver_pass() -> None:
    assert forbidden_op([tf2_graph()]) is None


@pytest.mark.parametrize(
    "op", ["ReadFile", "WriteFile", "MatchingFiles", "PyFunc", "EagerPyFunc", "ImmutableConst"]
)
def test_an_op_that_reaches_outside_is_named_with_its_function(op: str) -> None:
    found = forbidden_op([tf2_graph(("MatMul", op))])
    assert found is not None
    assert (found.op, found.function) == (op, "__inference_serve_5")
    assert found.message().startswith(
        f"the model uses the operation {op} (in function __inference_serve_5)"
    )
    assert found.message().endswith("it cannot be deployed")


@pytest.mark.parametrize("op", sorted(CHECKPOINT_OPS))
def test_checkpoint_ops_are_refused_where_a_signature_reaches_them(op: str) -> None:
    found = forbidden_op([tf2_graph(("MatMul", op))])
    assert found is not None and found.function == "__inference_serve_5"


def test_the_saver_functions_called_from_the_serving_path_are_refused() -> None:
    graph = tf2_graph()
    functions = dict(graph.functions)
    functions["__inference_serve_5"] = (
        Node("MatMul", "MatMul"),
        Node("call", "PartitionedCall", calls=("__inference__traced_restore_11",)),
    )
    found = forbidden_op([tf2_graph(functions=functions)])
    assert found is not None
    assert (found.op, found.function) == ("RestoreV2", "__inference__traced_restore_11")


def test_a_saver_nothing_calls_passes_and_other_ops_nothing_calls_do_not() -> None:
    """import_meta_graph leaves the imported graph's saver behind, unused."""
    graph = tf2_graph()
    orphans = (Node("save/SaveV2", "SaveV2"), Node("save/RestoreV2", "RestoreV2"))
    functions = {**graph.functions, "__inference_orphan_3": (Node("s", "SaveV2"),)}
    assert forbidden_op([tf2_graph(nodes=graph.nodes + orphans, functions=functions)]) is None
    functions = {**graph.functions, "__inference_orphan_3": (Node("w", "WriteFile"),)}
    found = forbidden_op([tf2_graph(functions=functions)])
    assert found is not None and (found.op, found.function) == ("WriteFile", "__inference_orphan_3")


def test_checkpoint_ops_in_object_graph_functions_are_refused() -> None:
    graph = tf2_graph()
    functions = {**graph.functions, "__inference_restore_like_3": (Node("r", "RestoreV2"),)}
    objects = (*graph.object_functions, "__inference_restore_like_3")
    found = forbidden_op([tf2_graph(functions=functions, object_functions=objects)])
    assert found is not None and found.function == "__inference_restore_like_3"


def test_init_ops_are_what_runs_too() -> None:
    graph = tf2_graph()
    nodes = (
        *graph.nodes,
        Node("init", "NoOp", inputs=("^init/restore",)),
        Node("init/restore", "RestoreV2"),
    )
    assert forbidden_op([tf2_graph(nodes=nodes)]) is None  # nothing names it
    found = forbidden_op([tf2_graph(nodes=nodes, roots=(*graph.roots, "init"))])
    assert found is not None and (found.op, found.node) == ("RestoreV2", "init/restore")


def test_functions_called_through_nested_calls_are_reached() -> None:
    graph = tf2_graph()
    functions = {
        **graph.functions,
        "__inference_serve_5": (Node("if", "StatelessIf", calls=("then_1", "else_1")),),
        "then_1": (Node("p", "PyFuncStateless"),),
        "else_1": (Node("i", "Identity"),),
    }
    found = forbidden_op([tf2_graph(functions=functions)])
    assert found is not None and (found.op, found.function) == ("PyFuncStateless", "then_1")


def test_a_node_of_the_graph_itself_is_named() -> None:
    graph = tf2_graph()
    nodes = (*graph.nodes, Node("leak", "WriteFile", inputs=("serving_default_x",)))
    found = forbidden_op([tf2_graph(nodes=nodes)])
    assert found is not None
    assert (found.op, found.function, found.node) == ("WriteFile", None, "leak")
    assert "(node leak)" in found.message()


def test_tf1_saver_nodes_pass_and_a_restore_feeding_a_signature_does_not() -> None:
    nodes = (
        Node("x", "Placeholder"),
        Node("w", "VariableV2"),
        Node("y", "MatMul", inputs=("x", "w")),
        Node("save/Const", "Const"),
        Node("save/SaveV2", "SaveV2", inputs=("save/Const", "w")),
        Node("save/control_dependency", "Identity", inputs=("save/Const", "^save/SaveV2")),
        Node("save/RestoreV2", "RestoreV2", inputs=("save/Const",)),
        Node("save/Assign", "Assign", inputs=("w", "save/RestoreV2")),
        Node("save/restore_all", "NoOp", inputs=("^save/Assign",)),
    )
    graph = Graph(nodes=nodes, functions={}, roots=("x:0", "y:0"))
    assert forbidden_op([graph]) is None
    leaking = Graph(
        nodes=(*nodes, Node("z", "Add", inputs=("y", "save/RestoreV2"))),
        functions={},
        roots=("x:0", "z:0"),
    )
    found = forbidden_op([leaking])
    assert found is not None and (found.op, found.node) == ("RestoreV2", "save/RestoreV2")


@pytest.mark.parametrize(
    ("op", "attrs", "refused"),
    [
        ("PrintV2", {}, False),
        ("PrintV2", {"output_stream": "stderr"}, False),
        ("PrintV2", {"output_stream": "log(info)"}, False),
        ("PrintV2", {"output_stream": "file:///tmp/out.txt"}, True),
        ("DecodeProtoV2", {"descriptor_source": "local://"}, False),
        ("DecodeProtoV2", {"descriptor_source": "/etc/descriptors.bin"}, True),
    ],
)
def test_ops_allowed_with_some_attribute_values(
    op: str, attrs: dict[str, str], refused: bool
) -> None:
    graph = tf2_graph()
    functions = {**graph.functions, "__inference_serve_5": (Node("p", op, attrs=attrs),)}
    found = forbidden_op([tf2_graph(functions=functions)])
    assert (found is not None) is refused


def test_every_meta_graph_is_checked() -> None:
    found = forbidden_op([tf2_graph(), tf2_graph(("TFRecordDataset",))])
    assert found is not None and found.op == "TFRecordDataset"


def test_the_lists_are_data() -> None:
    assert CHECKPOINT_OPS <= DENIED_OPS
    assert {"ReadFile", "WriteFile", "MatchingFiles", "PyFunc", "EagerPyFunc"} <= DENIED_OPS
    assert "ImmutableConst" in DENIED_OPS
