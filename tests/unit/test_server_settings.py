"""Every way the platform serves HTTP takes its settings from service.http.server: the code
builds uvicorn's configuration only through `server_config` (no proxy headers), and every
`uvicorn` command line of the image, compose, the chart, the benchmarks and the tests'
separate API processes carries `UVICORN_FLAGS`."""

from __future__ import annotations

import re
from pathlib import Path

from service.http.server import UVICORN_FLAGS, server_config

ROOT = Path(__file__).resolve().parents[2]
CODE = ("service", "composition", "worker", "dlaas")
COMMANDS = ("docker", "helm", "benchmarks", "tests")


def test_the_configuration_trusts_no_proxy_headers() -> None:
    config = server_config(object(), host="127.0.0.1", port=1)
    assert config.proxy_headers is False
    assert config.access_log is False
    assert "--no-proxy-headers" in UVICORN_FLAGS


def test_the_code_configures_uvicorn_in_one_place() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for top in CODE
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != ROOT / "service" / "http" / "server.py"
        for line in path.read_text().splitlines()
        if re.search(r"uvicorn\.(Config|run)\(", line)
    ]
    assert found == []


# `-m uvicorn` (a YAML list, a JSON array, an argv) or the venv's `BIN / "uvicorn"`.
_UVICORN = re.compile(r"""["']?-m["']?,?\s*(?:-\s*)?["']?uvicorn\b|/ "uvicorn"\)""")


def _uvicorn_commands(text: str) -> list[str]:
    """Each command line in `text` that runs uvicorn's command line: the text from its
    `uvicorn` to the end of the command."""
    commands = []
    for match in _UVICORN.finditer(text):
        rest = text[match.end() :]
        # A YAML list ends at the next key; a JSON array or argv at its closing bracket.
        end = re.search(r"\]|\n\s*[a-zA-Z_]+:", rest)
        commands.append(rest[: end.start() if end else len(rest)])
    return commands


def test_every_uvicorn_command_line_has_the_flags() -> None:
    commands = [
        (path.relative_to(ROOT), command)
        for top in COMMANDS
        for path in sorted((ROOT / top).rglob("*"))
        if path.is_file()
        and path.suffix in {".py", ".yaml", ".yml", ""}
        and path.name != "test_server_settings.py"
        for command in _uvicorn_commands(path.read_text(errors="replace"))
    ]
    # The image, compose, the chart, three benchmarks and three tests' API processes.
    assert len(commands) >= 9, commands
    missing = [
        f"{path}: {' '.join(command.split())[:200]}"
        for path, command in commands
        if "UVICORN_FLAGS" not in command and not all(flag in command for flag in UVICORN_FLAGS)
    ]
    assert missing == []
