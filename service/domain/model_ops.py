"""Which TensorFlow operations a deployed model may not use. Pure rules over a SavedModel's
graphs, described as plain data (`Graph`); no TensorFlow here.

A model runs in a sandbox (service.scoring.process), but what it can see there - the
system's files, its own directory - is still more than scoring needs, and some operations
run code or reach out by design. So a SavedModel that uses an operation of `DENIED_OPS`
anywhere in its graphs or in any function of its library is refused at deploy, with the
operation and the function it sits in named.

Save and restore. A SavedModel carries its saver: functions (TF2) or nodes (TF1) that
write and read checkpoints (SaveV2, RestoreV2, MergeV2Checkpoints), which serving never
calls (TensorFlow's loader restores a TF1 model's variables through the saver's restore
op, from the model's own variables path); a graph imported with `import_meta_graph`, as
the README's export procedure does, carries an older saver of its own that nothing calls
at all. So the checkpoint operations (`CHECKPOINT_OPS`) are refused only where what runs
when the model loads or serves reaches them: its signatures, its init and main ops (the
collections' node lists), the functions of its object graph (TF2), and everything these
read or call. Every other operation of `DENIED_OPS` is refused wherever it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Operations that read or write files, run Python code, or use the network.
DENIED_OPS: frozenset[str] = frozenset(
    {
        # files, by name
        "ReadFile",
        "WriteFile",
        "MatchingFiles",
        "ImmutableConst",
        "FileSystemSetConfiguration",
        "InitializeTableFromTextFile",
        "InitializeTableFromTextFileV2",
        "LoadAndRemapMatrix",
        "GenerateVocabRemapping",
        # checkpoints (see CHECKPOINT_OPS)
        "Save",
        "SaveV2",
        "SaveSlices",
        "Restore",
        "RestoreV2",
        "RestoreSlice",
        "MergeV2Checkpoints",
        # readers
        "WholeFileReader",
        "WholeFileReaderV2",
        "TextLineReader",
        "TextLineReaderV2",
        "TFRecordReader",
        "TFRecordReaderV2",
        "FixedLengthRecordReader",
        "FixedLengthRecordReaderV2",
        "LMDBReader",
        # datasets over files, or writing them
        "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2",
        "TextLineDataset",
        "TFRecordDataset",
        "TFRecordDatasetV2",
        "CSVDataset",
        "CSVDatasetV2",
        "ExperimentalCSVDataset",
        "LMDBDataset",
        "ExperimentalLMDBDataset",
        "SqlDataset",
        "ExperimentalSqlDataset",
        "CacheDataset",
        "CacheDatasetV2",
        "SnapshotDataset",
        "SnapshotDatasetV2",
        "SnapshotDatasetReader",
        "SnapshotNestedDatasetReader",
        "SaveDataset",
        "SaveDatasetV2",
        "LoadDataset",
        "DistributedSave",
        "DatasetToTFRecord",
        "ExperimentalDatasetToTFRecord",
        # summaries written to files or databases
        "CreateSummaryFileWriter",
        "CreateSummaryDbWriter",
        "SummaryWriter",
        "WriteSummary",
        "WriteScalarSummary",
        "WriteHistogramSummary",
        "WriteImageSummary",
        "WriteAudioSummary",
        "WriteGraphSummary",
        "WriteRawProtoSummary",
        "ImportEvent",
        "FlushSummaryWriter",
        "CloseSummaryWriter",
        # debugger ops, which write to files or send over gRPC
        "DebugIdentity",
        "DebugIdentityV2",
        "DebugIdentityV3",
        "DebugNanCount",
        "DebugNumericSummary",
        "DebugNumericSummaryV2",
        # Python code
        "PyFunc",
        "PyFuncStateless",
        "EagerPyFunc",
        # the network
        "RpcClient",
        "RpcCall",
        "RpcServer",
        "RpcServerStart",
        "RpcServerRegister",
        "RpcCheckStatus",
        "RpcGetValue",
        "DeleteRpcFutureResource",
        "DataServiceDataset",
        "DataServiceDatasetV2",
        "DataServiceDatasetV3",
        "DataServiceDatasetV4",
        "RegisterDataset",
        "RegisterDatasetV2",
        "CollectiveReduce",
        "CollectiveReduceV2",
        "CollectiveReduceV3",
        "CollectiveReduceScatterV2",
        "CollectiveGather",
        "CollectiveGatherV2",
        "CollectiveBcastSend",
        "CollectiveBcastSendV2",
        "CollectiveBcastRecv",
        "CollectiveBcastRecvV2",
        "CollectiveAllToAllV2",
        "CollectiveAllToAllV3",
        "CollectiveInitializeCommunicator",
        "CollectiveAssignGroupV2",
        "RemoteCall",
        "_Send",
        "_Recv",
        "_HostSend",
        "_HostRecv",
    }
)

# Of DENIED_OPS, those allowed where loading or serving the model does not reach them
# (the SavedModel's own saver).
CHECKPOINT_OPS: frozenset[str] = frozenset(
    {"Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2", "RestoreSlice", "MergeV2Checkpoints"}
)

# Operations allowed only with these values of a string attribute (absent: its default,
# which is allowed): printing to a file, protocol descriptors read from a file.
ALLOWED_ATTRS: Mapping[str, tuple[str, frozenset[str]]] = {
    "PrintV2": (
        "output_stream",
        frozenset({"stderr", "stdout", "log(info)", "log(warning)", "log(error)"}),
    ),
    "DecodeProtoV2": ("descriptor_source", frozenset({"local://"})),
    "EncodeProto": ("descriptor_source", frozenset({"local://"})),
}

# The string attributes a graph's description must carry for ALLOWED_ATTRS.
ATTRS_OF_INTEREST: tuple[str, ...] = tuple(sorted({a for a, _ in ALLOWED_ATTRS.values()}))


@dataclass(frozen=True)
class Node:
    """One operation: of the graph (with the nodes it reads, `inputs`) or of a function."""

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    # The functions it calls (its function-valued attributes).
    calls: tuple[str, ...] = ()
    # Its string attributes named in ATTRS_OF_INTEREST.
    attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Graph:
    """One meta graph of a SavedModel."""

    nodes: tuple[Node, ...]
    functions: Mapping[str, tuple[Node, ...]]
    # Nodes that run when the model loads or serves: the signatures' tensors, the
    # collections' node lists (init and main ops).
    roots: tuple[str, ...] = ()
    # Functions of the object graph (TF2), which the loader may call.
    object_functions: tuple[str, ...] = ()


@dataclass(frozen=True)
class ForbiddenOp:
    op: str
    # The function it is in; None for a node of the graph itself.
    function: str | None
    node: str

    def message(self) -> str:
        where = f"in function {self.function}" if self.function else f"node {self.node}"
        return (
            f"the model uses the operation {self.op} ({where}), which reads or writes "
            "files, runs code outside the model, or uses the network; it cannot be deployed"
        )


def _denied(node: Node, *, runs: bool) -> bool:
    """Whether `node` is refused; `runs`: whether loading or serving the model reaches it."""
    rule = ALLOWED_ATTRS.get(node.op)
    if rule is not None:
        attr, allowed = rule
        value = node.attrs.get(attr)
        return value is not None and value not in allowed
    if node.op in CHECKPOINT_OPS:
        return runs
    return node.op in DENIED_OPS


def _ancestors(graph: Graph, start: Iterable[str]) -> set[str]:
    """`start` and every node they read from, transitively."""
    by_name = {n.name: n for n in graph.nodes}
    seen: set[str] = set()
    stack = [n for n in (_node_name(s) for s in start) if n in by_name]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        inputs = (_node_name(i) for i in by_name[name].inputs)
        stack.extend(i for i in inputs if i in by_name and i not in seen)
    return seen


def _callees(graph: Graph, start: Iterable[str]) -> set[str]:
    """`start` and every function they call, transitively."""
    seen: set[str] = set()
    stack = [s for s in start if s in graph.functions]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in graph.functions[name]:
            stack.extend(c for c in node.calls if c in graph.functions and c not in seen)
    return seen


def _node_name(tensor: str) -> str:
    """ "x:0" and "^x" -> "x"."""
    return tensor.lstrip("^").split(":", 1)[0]


def _check_graph(graph: Graph) -> ForbiddenOp | None:
    running_nodes = _ancestors(graph, graph.roots)
    called = {c for n in graph.nodes if n.name in running_nodes for c in n.calls}
    running_functions = _callees(graph, called | set(graph.object_functions))
    for node in graph.nodes:
        if _denied(node, runs=node.name in running_nodes):
            return ForbiddenOp(node.op, None, node.name)
    for name in sorted(graph.functions):
        for node in graph.functions[name]:
            if _denied(node, runs=name in running_functions):
                return ForbiddenOp(node.op, name, node.name)
    return None


def forbidden_op(graphs: Sequence[Graph]) -> ForbiddenOp | None:
    """The first operation a model may not use, in any of its meta graphs; None if there
    is none."""
    for graph in graphs:
        found = _check_graph(graph)
        if found is not None:
            return found
    return None
