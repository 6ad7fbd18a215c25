"""The layering of ARCHITECTURE.md holds: imports run one way (checked by import-linter,
whose contracts live in pyproject.toml), the check can fail, and the document's table is
the contract's list."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "worker", "dlaas", "composition")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_imports_follow_the_contracts() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # An infrastructure module reaching up into the worker.
        ("service/storage/keys.py", "import worker.execution", "Dependencies run one way"),
        # The domain reaching into persistence.
        ("service/domain/states.py", "import service.db.repository", "Dependencies run one way"),
        # Scoring reaching into the API's internals.
        ("service/scoring/app.py", "import service.api.deps", "Dependencies run one way"),
        # The client importing server code.
        ("dlaas/client.py", "import service.settings", "The client and CLI"),
        # The domain doing I/O.
        ("service/domain/catalog.py", "import sqlalchemy", "are pure"),
        # A learner importing the worker's execution.
        ("worker/learner/rank.py", "import worker.execution", "Inside the worker"),
        # A pod's run step, in the runtime's image, importing the platform's dependencies.
        ("worker/learner/pod_run.py", "import service.storage.keys", "standard library"),
        ("worker/learner/pod_io.py", "import tenacity", "standard library"),
    ],
)
def test_a_forbidden_import_breaks_the_check(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # noqa: E402\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    report = result.stdout.split("Broken contracts", 1)[-1]
    assert broken in report
    assert module.removesuffix(".py").replace("/", ".") in report


def architecture_layers() -> list[str]:
    """The rows of the layers table in ARCHITECTURE.md, top first, as `a | b` strings."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if re.match(r"\|\s*\d+\s*\|", r)]
    layers = []
    for row in rows:
        cells = re.split(r"(?<!\\)\|", row)  # `\|` inside a cell separates modules
        modules = re.findall(r"`([a-z_.]+)`", cells[2])
        layers.append(" | ".join(modules))
    return layers


def test_the_architecture_table_is_the_contract() -> None:
    expected = [
        layer.replace("(", "").replace(")", "") for layer in contracts()["layers"]["layers"]
    ]
    assert architecture_layers() == expected


def test_every_service_module_has_a_layer() -> None:
    layered = {
        m.strip().strip("()") for layer in contracts()["layers"]["layers"] for m in layer.split("|")
    }
    modules = {
        f"service.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "service").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert modules - layered == set(), "give each service module a layer in pyproject.toml"


def _sources(*packages: str) -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(), str(path)))
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


_STATEMENT_BUILDERS = {"select", "update", "delete", "insert", "text", "func"}
_QUERY_METHODS = {"execute", "scalars", "scalar"}
_DATABASE_HANDLES = {"session", "conn"}


def test_every_query_is_in_the_repository() -> None:
    offenders = []
    for path, tree in _sources("service", "worker", "composition", "dlaas"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("service/db/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
                built = {a.name for a in node.names} & _STATEMENT_BUILDERS
                if built:
                    offenders.append(f"{rel}:{node.lineno} imports {sorted(built)}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and (
                    node.func.attr in _QUERY_METHODS | {"get"}
                    and ast.unparse(node.func.value) in _DATABASE_HANDLES
                )
            ):
                offenders.append(f"{rel}:{node.lineno} {ast.unparse(node.func)}(...)")
    assert offenders == [], "queries belong in service/db/repository/"


# What object-store keys look like (f-strings with {} for their fields): the platform's
# trainings/ and deployments/ trees, results/, a learner's folder in them and its log file,
# and the user bucket's training-<id>/. The local backend's own directories
# (learner-<i>, learner-<i>.jsonl) and the API's paths (/v1/trainings/...) are not keys.
_KEY_PARTS = re.compile(
    r"(^|/)(trainings|deployments|results)/|learner-\{\}/|training-log|^training-\{\}"
)


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with {} for each field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def test_object_keys_are_built_in_one_module() -> None:
    offenders = []
    for path, tree in _sources("service", "worker", "composition"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "service/storage/keys.py":
            continue
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            text = _text(node)
            if text is None or text.startswith("/") or id(node) in docstrings:
                continue  # not a string, an HTTP path, or prose
            if _KEY_PARTS.search(text):
                offenders.append(f"{rel}:{getattr(node, 'lineno', '?')} {text!r}")
    assert offenders == [], "object-store keys are built by service/storage/keys.py"
