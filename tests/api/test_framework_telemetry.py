"""The platform's apps export nothing through FastAPI's own telemetry: with OpenTelemetry
providers configured in the process (as an agent or FASTAPI_OTEL_AUTO_CONFIGURE would),
no request asks them for a tracer, a meter or a span (service.http.server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("telemetry_probe.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("app", ["api", "scoring"])
def test_configured_providers_hear_nothing_of_the_requests(tmp_path: Path, app: str) -> None:
    done = subprocess.run(
        [sys.executable, str(PROBE), app],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "DLAAS_HOME": str(tmp_path / "home"),
            "PYTHONPATH": str(ROOT),
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [], done.stdout[-2000:]
