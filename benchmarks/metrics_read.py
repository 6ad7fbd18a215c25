"""What GET /v1/trainings/{id}/metrics costs on the largest log a plan allows.

metrics_read_large_over_small: the median time of `GET .../metrics` on a training whose
log is the standard plan's `max_log_bytes_per_training` (256 MiB, ~2.7 million lines of
~100 bytes, its learner printing until the plan's cap cuts it) with 32 metric regexes,
over the same on a training whose log is 1,000 lines; target <= 1.5. Both logs hold the
same 1,000 metric lines (each of the 32 metrics in turn), spread through the large one
among ordinary output, so the two answers are alike and the ratio shows what the log's
size adds. Both trainings run through `dlaas up` (the learners' wrappers find the points
as they write the log); the reads alternate, small then large, in the same run.

The detail also gives the time at the cap: a training every line of whose output is a
metric line, so that each metric holds its 1,562 points (49,984 in all, the most one
learner stores), whatever the log's size.

    python benchmarks/metrics_read.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Platform, Row, dlaas_up, manifest, median, zip_code

METRICS = [{"name": f"m{i}", "regex": rf"\bm{i}=([0-9.]+)"} for i in range(32)]
METRIC_LINES = 1_000
SMALL_LINES = 1_000
# The standard plan's max_log_bytes_per_training (service/domain/catalog.py's default).
LARGE_BYTES = 256 * 2**20
LINE_BYTES = 100
# Prints `lines` lines of LINE_BYTES (with the newline), METRIC_LINES of them metric lines
# spread evenly (all of them metric lines with `dense`), in chunks of ~1 MiB, pausing
# `pause` seconds after each. The large log is printed at a pace the learner's metric
# extraction keeps up with: printed as fast as it can be, 256 MiB outran it on a quiet
# 2-core machine, which then skips what is too far behind (by design, counted in the
# document's `skipped_lines`: it never slows the command down), and the large answer held
# 255 of the 1,000 points. This row measures reading a large log, not printing one
# (log_throughput does).
LARGE_PAUSE = 0.03
PRINTER = """
import sys, time
lines, dense, metric_lines, width = int(sys.argv[1]), sys.argv[2] == "dense", 1000, 100
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
every = 1 if dense else max(1, lines // metric_lines)
pad = "x" * 200
out, size = [], 0
for i in range(lines):
    if i % every == 0:
        k = i // every
        line = f"step {k} m{k % 32}={k % 1000 / 1000} "
    else:
        line = f"{i:08d} "
    line = (line + pad)[: width - 1] + "\\n"
    out.append(line)
    size += len(line)
    if size >= 1 << 20:
        sys.stdout.write("".join(out))
        out, size = [], 0
        if pause:
            sys.stdout.flush()
            time.sleep(pause)
sys.stdout.write("".join(out))
"""


def _manifest(command: str) -> str:
    document = yaml.safe_load(manifest(command))
    document["evaluation_metrics"] = METRICS
    return str(yaml.safe_dump(document))


def _training(platform: Platform, lines: int, dense: bool = False, pause: float = 0.0) -> str:
    with platform.client() as http:
        kind = "dense" if dense else "spread"
        command = f"python3 run.py {lines} {kind} {pause}"
        t = platform.submit(http, _manifest(command), zip_code({"run.py": PRINTER}))
        done = platform.wait(http, t["id"], {"COMPLETED", "FAILED"}, timeout=1800, poll=0.5)
        if done["status"] != "COMPLETED":
            raise RuntimeError(f"the training printing {lines} lines ended {done['status']}")
        return str(t["id"])


def _read(http: Any, training_id: str) -> tuple[float, int]:
    """One GET .../metrics: (seconds, points in the answer)."""
    started = time.perf_counter()
    r = http.get(f"/v1/trainings/{training_id}/metrics")
    elapsed = time.perf_counter() - started
    r.raise_for_status()
    return elapsed, sum(len(points) for points in r.json().values())


def _log_bytes(platform: Platform, training_id: str) -> int:
    """The size of learner 1's training-log.txt among the results."""
    with platform.client() as http:
        files = http.get(f"/v1/trainings/{training_id}/results").json()["files"]
    return sum(f["size"] for f in files if f["path"] == "learner-1/training-log.txt")


def run(quick: bool) -> list[Row]:
    repeats = 21 if quick else 61
    with dlaas_up() as platform:
        small = _training(platform, SMALL_LINES)
        # More lines than fit: the plan's cap cuts the log at its largest.
        large = _training(platform, LARGE_BYTES // LINE_BYTES + 1000, pause=LARGE_PAUSE)
        capped = _training(platform, 60_000, dense=True)
        large_log = _log_bytes(platform, large)
        small_times, large_times, capped_times = [], [], []
        points: dict[str, int] = {}
        with platform.client() as http:
            for training_id in (small, large, capped):  # warm-up
                _read(http, training_id)
            for _ in range(repeats):
                for name, training_id, times in (
                    ("small", small, small_times),
                    ("large", large, large_times),
                    ("capped", capped, capped_times),
                ):
                    elapsed, points[name] = _read(http, training_id)
                    times.append(elapsed)
    if points["small"] != points["large"] or points["small"] != METRIC_LINES:
        raise RuntimeError(f"the answers differ: {points}")
    small_s, large_s = median(small_times), median(large_times)
    return [
        Row(
            "metrics_read_large_over_small",
            round(large_s * 1000, 2),
            "ms",
            baseline=round(small_s * 1000, 2),
            ratio=round(large_s / small_s, 3),
            detail={
                "ratio": "median GET .../metrics time on the large log / on the 1,000-line log",
                # The plan's cap counts the lines' bytes; training-log.txt also holds
                # each line's time stamp.
                "large_log_bytes": LARGE_BYTES,
                "large_log_lines": LARGE_BYTES // LINE_BYTES,
                "large_training_log_txt_bytes": large_log,
                "small_log_lines": SMALL_LINES,
                "metrics": len(METRICS),
                "points_per_answer": points["large"],
                "reads": repeats,
                "capped_points": points["capped"],
                "capped_ms": round(median(capped_times) * 1000, 2),
                "target": "ratio <= 1.5",
            },
        ).emit()
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
