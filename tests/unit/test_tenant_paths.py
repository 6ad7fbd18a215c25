"""Nothing outside `service/tenantfs.py` opens a path by name in the modules that handle
the directories a tenant's code writes (RESULT_DIR, LOG_DIR, CHECKPOINT_DIR, MODEL_DIR,
DATA_DIR, a pod's `io` volume): such a path can be a link to the platform's secrets by
the time it is opened. Every call that opens, reads, stats, lists, walks or copies a file
by name is flagged unless its enclosing function is in ALLOWED below, with the
platform-owned path it opens."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The modules whose code handles tenant-writable directories.
CHECKED = [
    "worker/learner/*.py",
    "worker/backends/local*.py",
    "worker/backends/kubernetes/*.py",
    "service/storage/*.py",
    "service/scoring/*.py",
]
OWNER = "service/tenantfs.py"

# Module functions that take a path and open, stat, list, walk or copy what it names.
_MODULE_CALLS = {
    "os": {"open", "stat", "lstat", "walk", "scandir", "listdir", "fwalk"},
    "os.path": {"exists", "lexists", "isfile", "isdir", "islink", "getsize", "realpath"},
    "io": {"open"},
    "shutil": {"copy", "copy2", "copyfile", "copytree", "move", "copymode", "copystat"},
    "tarfile": {"open"},
    "zipfile": {"ZipFile"},
    "gzip": {"open"},
    "glob": {"glob", "iglob"},
}
# Methods only paths have (pathlib.Path), flagged whatever they are called on.
_PATH_METHODS = {
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "iterdir",
    "rglob",
    "glob",
    "put_file",
}
# Methods other objects share (an object store's `open` and `stat`): flagged when the
# receiver is a path: Path(...), a `/` join, or a name that says path, dir or file.
_AMBIGUOUS_METHODS = {"open", "stat", "lstat", "exists", "is_file", "is_dir", "touch"}
_BARE_CALLS = {"open", "ZipFile"}
# service.tenantfs's own classes: what they open is resolved beneath a directory descriptor.
_TENANTFS = {"TenantDir", "tenantfs", "tenantfs.TenantDir"}

# "module path::qualified function": the platform-owned path it opens by name.
ALLOWED: dict[str, str] = {
    # The scoring service: its own cache directory (DLAAS_HOME), never a tenant's.
    "service/scoring/cache.py::fetch_tree": "writes a model into the scoring cache dir",
    "service/scoring/cache.py::upload_tree": "uploads a model from the scoring cache dir",
    "service/scoring/cache.py::has_model": "the model's marker in the scoring cache dir",
    "service/scoring/model_server.py::_saved_model": "saved_model.pb in the scoring cache dir",
    "service/scoring/model_server.py::main": "model.onnx in the scoring cache dir's copy",
    "service/scoring/tfs_protos.py::serialized_descriptor": "the installed TF Serving protos",
    "worker/backends/local.py::LocalBackend.stop": "the training's network state dir (ours)",
    # Archives: the platform's own spooled copy of the code archive.
    "service/storage/archives.py::_zip_entries": "the archive's spooled copy (private dir)",
    "service/storage/archives.py::_tar_entries": "the archive's spooled copy (private dir)",
    "service/storage/archives.py::detect_format": "the archive's spooled copy (private dir)",
    # The local object store: its root is DLAAS_HOME's store, which only the platform writes.
    "service/storage/local.py::LocalObjectStore._info": "an object in the store's root",
    "service/storage/local.py::LocalObjectStore.put_file": "a platform-owned file (put_file)",
    "service/storage/local.py::LocalObjectStore.stat": "an object in the store's root",
    "service/storage/local.py::LocalObjectStore._walk": "directories of the store's root",
    "service/storage/local.py::LocalObjectStore.delete_prefix": "the store's root",
    "service/storage/s3.py::S3ObjectStore.put_file": "a platform-owned file (put_file)",
    # MPI's relay: the client runs in the sandbox (the tenant's own process); the relay's
    # directory is made by the backend in the training dir, which no sandbox shows.
    "worker/learner/mpi_client.py::main": "the relay's socket, from inside the sandbox",
    "worker/learner/mpi_relay.py::MpiRelay.serving": "<training dir>/mpi-relay",
    # The local backend: its training directory's own files (not the learners' dirs) and /proc.
    "worker/backends/local_learners.py::pid_alive": "/proc/<pid>/stat",
    "worker/backends/local_learners.py::read_json": "state.json, status files: training dir",
    "worker/backends/local_learners.py::belongs": "/proc/<pid>/cmdline and environ",
    "worker/backends/local_learners.py::write_json": "state.json and ranks.json: training dir",
    "worker/backends/local_learners.py::wrapper_started": "/proc, to find a wrapper",
    "worker/backends/local_mpi.py::mpi_setup": "<training dir>/mpi-agent (read-only inside)",
    "worker/backends/local.py::LocalBackend._prepare": "the hostfile and rank output files",
    "worker/backends/local.py::LocalBackend._spawn": "the wrapper's own log in the training dir",
    "worker/backends/local.py::LocalBackend.held": "the backend's work root",
    # worker/learner: the wrapper's and the steps' own files.
    "worker/learner/host.py::FileRendezvous.ready": "the rendezvous file in the training dir",
    "worker/learner/host.py::FileRendezvous.wait": "the peers' rendezvous files",
    "worker/learner/host.py::LocalHost.write": "the host file beside the spec",
    "worker/learner/host.py::LocalHost.read": "the host file beside the spec",
    "worker/learner/logtee.py::LogTee.__init__": "the learner's log in the private dir",
    "worker/learner/spec.py::LearnerSpec.read": "the learner spec the backend wrote",
    "worker/learner/spec.py::LearnerSpec.write": "the learner spec, in the backend's directory",
    "worker/learner/rank.py::main": "ranks.json and the rank output file of the training dir",
    "worker/learner/pod_io.py::open_regular": "the run step's PathIo: the tenant's own side",
    "worker/learner/pod_io.py::PathIo.names": "the run step's PathIo: the tenant's own side",
    "worker/learner/pod_io.py::SegmentWriter._open": "the run step writes its output (as tenant)",
    "worker/learner/pod_io.py::write_termination_message": "the kubelet's termination log",
    "worker/learner/pod_run.py::install_ssh_keys": "the run step (as the tenant): its ssh keys",
}


@dataclass(frozen=True)
class Finding:
    module: str
    function: str
    line: int
    call: str

    @property
    def where(self) -> str:
        return f"{self.module}::{self.function}"


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _is_pathish(node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        return _dotted(node.func) in ("Path", "pathlib.Path", "PurePath")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return True
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    if not isinstance(name, str):
        return False
    lowered = name.lower()
    return any(word in lowered for word in ("path", "dir", "file", "root", "target", "dest"))


def _flagged(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id if func.id in _BARE_CALLS else None
    if not isinstance(func, ast.Attribute):
        return None
    receiver = _dotted(func.value)
    if receiver in _TENANTFS:
        return None
    if receiver in _MODULE_CALLS:
        return f"{receiver}.{func.attr}" if func.attr in _MODULE_CALLS[receiver] else None
    if func.attr in _PATH_METHODS:
        return f"{receiver or '<expr>'}.{func.attr}"
    if func.attr in _AMBIGUOUS_METHODS and _is_pathish(func.value):
        return f"{receiver or '<expr>'}.{func.attr}"
    return None


def check_source(module: str, source: str) -> list[Finding]:
    """Every flagged call in `source`, with its enclosing function's qualified name."""
    findings: list[Finding] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Call) and (call := _flagged(child)) is not None:
                function = ".".join(scope) or "<module>"
                findings.append(Finding(module, function, child.lineno, call))
            visit(child, scope)

    visit(ast.parse(source), [])
    return findings


def checked_modules() -> list[Path]:
    files = {p for pattern in CHECKED for p in REPO.glob(pattern)}
    return sorted(p for p in files if p.relative_to(REPO).as_posix() != OWNER)


def unallowed(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.where not in ALLOWED]


def test_nothing_but_tenantfs_opens_a_path_by_name() -> None:
    findings = [
        f
        for path in checked_modules()
        for f in check_source(path.relative_to(REPO).as_posix(), path.read_text())
    ]
    assert unallowed(findings) == []
    # Every allowlist entry is still needed (an entry nothing uses is an opening left).
    used = {f.where for f in findings}
    assert sorted(set(ALLOWED) - used) == []


def test_the_checker_names_an_open_added_to_a_real_module() -> None:
    module = "worker/learner/transfers.py"
    source = (REPO / module).read_text()
    assert unallowed(check_source(module, source)) == []
    tree = ast.parse(source)
    transfers = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Transfers")
    method = next(
        n for n in transfers.body if isinstance(n, ast.FunctionDef) and n.name == "log_key"
    )
    method.body.insert(0, ast.parse("open(self.spec.log_dir + '/x').read()").body[0])
    method.body.insert(0, ast.parse("Path(self.spec.result_dir).stat()").body[0])
    tampered = ast.unparse(tree)
    found = unallowed(check_source(module, tampered))
    assert {(f.where, f.call) for f in found} == {
        (f"{module}::Transfers.log_key", "open"),
        (f"{module}::Transfers.log_key", "<expr>.stat"),
    }
