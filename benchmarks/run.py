"""Run every benchmark and write the rows to a JSON file.

    python benchmarks/run.py [--quick] [--json OUT] [--only NAME ...] [--rows ROW ...]

Each row is {"name", "value", "unit", "baseline", "ratio", "detail"}; every benchmark
measures its baseline in the same run (the machine is shared and noisy: compare ratios).
`--only` names benchmark files; `--rows` names rows (or shell patterns of them): only the
files that measure them run, told which rows are wanted (a file that can measure less for
fewer rows does: `scoring` trains and measures only the models named), and only those
rows are printed at the end. Every row of ROWS is printed at the end of a run, measured
or not: a row that was not measured says why (its file failed, was not asked for, or is
not written yet). Each file's end line, and each of its rows' `detail.steal_share`, say
what share of the machine's CPU time the hypervisor gave to other guests while it ran
(/proc/stat's steal): a VM's noise that the paired baselines cancel only in part.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import importlib.util
import inspect
import json
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, machine_cpu, steal_share

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
    "hvd_synthetic",
    "ddl_allreduce",
    "pytorch_ddp",
    "k8s",
]

# Every row the suite reports (with its target), by the benchmark file that measures it.
# The per-model scoring rows (`scoring_<model>_b<n>_...`) come with `scoring` too.
ROWS = {
    "submit_to_running_p50": "latency",
    "status_propagation_p99": "latency",
    "log_latency_p99": "latency",
    "training_overhead": "training_overhead",
    "api_get_training": "api",
    "api_get_training_postgresql": "api",
    "api_list_10k": "api",
    "log_throughput": "log_throughput",
    "metrics_read_large_over_small": "metrics_read",
    "submit_throughput": "submit_throughput",
    "noisy_neighbour_p99_ratio": "noisy_neighbour",
    "scoring_batch64": "scoring",
    "scoring_batching_gain": "scoring",
    "scoring_grpc_keras-single_b64": "scoring",
    "scoring_grpc_mlp_b64": "scoring",
    "scoring_grpc_wide_b64": "scoring",
    # TensorFlow Serving's REST path (/v1/models/{name}:predict).
    "scoring_rest_tfs_path_b64": "scoring",
    "hvd_synthetic_overhead": "hvd_synthetic",
    "ddl_allreduce_busbw": "ddl_allreduce",
    "k8s_submit_to_pods_p50": "k8s",
    "k8s_monitor_pass_requests": "k8s",
    "k8s_monitor_pass_ms": "k8s",
    "k8s_admission_pass_ms": "k8s",
    "k8s_gpu_utilisation": "k8s",
    # PyTorch: benchmarks/pytorch_ddp.py, and ONNX scoring: benchmarks/scoring_onnx.py.
    "pytorch_ddp_overhead": "pytorch_ddp",
    "scoring_onnx_b64": "scoring_onnx",
}


def wanted(name: str, patterns: list[str] | None) -> bool:
    return patterns is None or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def files_for(rows: list[str]) -> list[str]:
    """The benchmark files that measure `rows` (names or patterns), in BENCHMARKS order."""
    named = {ROWS[r] for r in ROWS if wanted(r, rows)}
    named |= {"scoring" for p in rows if p.startswith("scoring_") and p not in ROWS}
    return [b for b in BENCHMARKS if b in named]


def run_file(name: str, quick: bool, rows: list[str] | None) -> list[Row]:
    module = importlib.import_module(f"benchmarks.{name}")
    if rows is not None and "rows" in inspect.signature(module.run).parameters:
        measured: list[Row] = module.run(quick, rows=rows)
    else:
        measured = module.run(quick)
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (< 10 min)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these files")
    parser.add_argument("--rows", nargs="*", help="run only what measures these rows")
    args = parser.parse_args()
    names = args.only or (files_for(args.rows) if args.rows else BENCHMARKS)
    rows: list[Row] = []
    failed, missing = [], []
    for name in names:
        started = time.monotonic()
        print(f"== {name}", file=sys.stderr, flush=True)
        if importlib.util.find_spec(f"benchmarks.{name}") is None:
            missing.append(name)
            print(f"== {name}: not written yet", file=sys.stderr, flush=True)
            continue
        cpu = machine_cpu()
        try:
            measured = run_file(name, args.quick, args.rows)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            measured = []
        stolen = steal_share(cpu, machine_cpu())
        for row in measured:
            row.detail.setdefault("steal_share", stolen)
        rows.extend(measured)
        print(
            f"== {name}: {finished(time.monotonic() - started, stolen)}",
            file=sys.stderr,
            flush=True,
        )
    rows = [r for r in rows if wanted(r.name, args.rows)]
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    summary(rows, names, failed, missing, args.rows)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def finished(seconds: float, stolen: float | None) -> str:
    """How long a benchmark file ran, and how much of the machine's CPU time the
    hypervisor gave to other guests meanwhile (steal: no code of ours can win it back)."""
    if stolen is None:
        return f"{seconds:.0f} s"
    return f"{seconds:.0f} s, steal {stolen:.1%} of the CPUs' time"


def summary(
    rows: list[Row],
    ran: list[str],
    failed: list[str],
    missing: list[str],
    patterns: list[str] | None,
) -> None:
    """Every row of ROWS (those asked for), with its ratio or why it has none."""
    measured = {r.name: r for r in rows}
    print("== rows", file=sys.stderr)
    for name, file in ROWS.items():
        if not wanted(name, patterns):
            continue
        row = measured.get(name)
        if row is not None:
            shown = f"{row.ratio}" if row.ratio is not None else f"{row.value} {row.unit}"
        elif file in missing or importlib.util.find_spec(f"benchmarks.{file}") is None:
            shown = f"not measured: benchmarks/{file}.py is not written yet"
        elif file in failed:
            shown = f"not measured: benchmarks/{file}.py failed"
        elif file not in ran:
            shown = "not measured: not asked for"
        else:
            shown = f"not measured: benchmarks/{file}.py does not report it yet"
        print(f"{name:36} {shown}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
