"""The `dlaas` command line's failure reports, in-process: each invocation's options live in
its own typer context, so one command's --json never decides how the next one reports."""

from __future__ import annotations

import json

import pytest

from dlaas.cli import app

UNREACHABLE = "http://127.0.0.1:9"


def dlaas(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[object, str, str]:
    with pytest.raises(SystemExit) as exited:
        app(["--url", UNREACHABLE, "--api-key", "key", *args], prog_name="dlaas")
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def test_a_failure_under_json_is_also_a_document_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = dlaas(capsys, "show", "t1", "--json")
    assert code == 1
    problem = json.loads(out)
    assert problem["title"] == "ConnectionFailed" and UNREACHABLE in problem["detail"]
    assert "error:" in err and UNREACHABLE in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["show", "t1"], ["logs", "t1"], ["deployments", "list"]])
def test_json_does_not_carry_over_to_the_next_invocation(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert dlaas(capsys, "list", "--json")[0] == 1
    code, out, err = dlaas(capsys, *args)
    assert code == 1 and out == ""
    assert "error:" in err and UNREACHABLE in err
