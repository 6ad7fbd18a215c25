"""What the images, the chart and the compose file run must exist in this package: each
command is checked against the source, so a renamed module or console script fails here
instead of in a cluster."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHONS = ("python", "python3")
_PYTHON_FLAGS = ("-I", "-E", "-s", "-S", "-P", "-u", "-B")


def console_scripts() -> set[str]:
    """The console scripts of pyproject's [project.scripts]."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["project"].get("scripts", {}))


def extras() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["project"].get("optional-dependencies", {}))


def _attribute_problem(target: str, callable_: bool = True) -> str | None:
    """For "module:attr" (a uvicorn factory, a name imported): None if the module imports
    and has that attribute (callable, unless `callable_` is False)."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        return f"{target}: {module_name} does not import ({e})"
    if not hasattr(module, attr):
        return f"{target}: {module_name} has no {attr}"
    if callable_ and not callable(getattr(module, attr)):
        return f"{target}: {module_name}.{attr} is not callable"
    return None


def _code_problems(code: str) -> list[str]:
    """`python -c CODE`: it must compile and every name it imports must exist."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return [f"python -c: does not compile: {e}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                problem = _attribute_problem(f"{node.module}:{alias.name}", callable_=False)
                if problem:
                    problems.append(problem)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if importlib.util.find_spec(alias.name) is None:
                    problems.append(f"import {alias.name}: no such module")
    return problems


def command_problems(argv: list[str]) -> list[str]:
    """Why `argv` would not start in the platform's image; [] if it would."""
    if not argv:
        return ["empty command"]
    program = argv[0].rsplit("/", 1)[-1]
    if program in PYTHONS:
        # Interpreter flags before -m/-c (-I: isolated, as the learner images start).
        argv = [argv[0], *itertools.dropwhile(lambda a: a in _PYTHON_FLAGS, argv[1:])]
        if len(argv) >= 3 and argv[1] == "-m":
            module = argv[2]
            if importlib.util.find_spec(module) is None:
                return [f"python -m {module}: no such module"]
            if module == "uvicorn":
                targets = [a for a in argv[3:] if ":" in a and not a.startswith("-")]
                if not targets:
                    return ["uvicorn: no application named"]
                return [p for t in targets if (p := _attribute_problem(t))]
            return []
        if len(argv) >= 3 and argv[1] == "-c":
            return _code_problems(argv[2])
        return [f"{' '.join(argv)}: neither -m MODULE nor -c CODE"]
    if program in console_scripts():
        return []
    return [f"{program}: not a console script of pyproject.toml nor python"]
