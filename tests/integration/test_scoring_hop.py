"""benchmarks/scoring_hop.py, the model process's hop alone, runs against the scoring
code as it is (it is the tool for measuring changes to the model process, and had fallen
behind ServedModel's signature unnoticed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_hop_benchmark_runs_and_measures() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scoring_hop.py"), "--seconds", "0.3",
         "--repeats", "1", "--concurrency", "4"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    served = re.search(r"^served: ([\d,]+) predictions/s", done.stdout, re.M)
    assert served is not None, done.stdout
    assert int(served.group(1).replace(",", "")) > 0
    assert re.search(r"^ratio \d+\.\d+$", done.stdout, re.M), done.stdout
    assert re.search(r"^CPU per call: \d+ us here, \d+ us in the model process", done.stdout, re.M)
