"""Run every benchmark and write the rows to a JSON file.

    python benchmarks/run.py [--quick] [--json OUT] [--only NAME ...]

Each row is {"name", "value", "unit", "baseline", "ratio", "detail"}; every benchmark
measures its baseline in the same run (the machine is shared and noisy: compare ratios).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row

BENCHMARKS = [
    "latency",
    "training_overhead",
    "api",
    "log_throughput",
    "metrics_read",
    "submit_throughput",
    "noisy_neighbour",
    "scoring",
    "scoring_onnx",
    "ddl_allreduce",
    "pytorch_ddp",
    "k8s",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (< 10 min)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these")
    args = parser.parse_args()
    rows: list[Row] = []
    failed = []
    for name in args.only or BENCHMARKS:
        started = time.monotonic()
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            rows.extend(module.run(args.quick))
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"== {name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
