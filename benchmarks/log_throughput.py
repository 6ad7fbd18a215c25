"""How many log lines a learner can print through the platform.

log_throughput: a learner that prints 100,000 lines of 100 bytes as fast as it can. Through
the platform (`dlaas up`, the file log store it uses by default) its lines go through the
learner wrapper's log tee to the live log store while a client follows the log
(`GET .../logs?follow=true`); by hand, the same program with the same environment
(PYTHONUNBUFFERED=1, as learners get: one write per line) writes to a file. Two ratios, both
with target >= 0.8, the row's ratio being the lower:

- lines per second reaching the log store (from the program's first line to the moment the
  store holds its last) against the lines per second the program writes to the file;
- the program's own wall time by hand against through the platform (does the tee slow the
  learner down?).

The training lists 32 `evaluation_metrics` regexes, as a closely watched training might (one
finds every line's number, 31 find nothing), so the tee also searches every line for them.

Each ratio is the median over back-to-back pairs (a run through the platform and one by
hand, the order swapped every pair), as in training_overhead. The run also checks what the
numbers rely on: the store holds every line, in order, and the follower saw them all, in
order.

    python benchmarks/log_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Platform, Row, dlaas_up, manifest, median, profiled, zip_code

LINES = 100_000
# Each line: its number (8 digits), a space, 90 bytes of text and the newline: 100 bytes.
PRINTER = """
import sys, time
n = int(sys.argv[1])
text = "x" * 90
start = time.time()
began = time.perf_counter()
for i in range(n):
    print(f"{i:08d} {text}")
print("wall", repr(time.perf_counter() - began), "start", repr(start), flush=True)
"""


# One regex finds each line's number, 31 never match: every line is searched for all 32.
METRICS = [{"name": "line", "regex": r"^(\d{8}) "}] + [
    {"name": f"m{i}", "regex": rf"\bm{i}=([0-9.]+)"} for i in range(31)
]


def _manifest(command: str) -> str:
    document = yaml.safe_load(manifest(command))
    document["evaluation_metrics"] = METRICS
    return str(yaml.safe_dump(document))


def _program_times(last_line: str) -> tuple[float, float]:
    """(its own wall time, when it started: seconds since the epoch) from the last line."""
    words = last_line.split()
    return float(words[words.index("wall") + 1]), float(words[words.index("start") + 1])


def direct(lines: int) -> float:
    """The program's own wall time, writing to a file, with the learners' PYTHONUNBUFFERED."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "run.py"
        script.write_text(PRINTER)
        out = Path(tmp) / "out.txt"
        with out.open("wb") as f:
            subprocess.run(
                [sys.executable, str(script), str(lines)],
                stdout=f,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                check=True,
            )
        text = out.read_text().splitlines()
        check_lines(text, lines, "the file")
        return _program_times(text[-1])[0]


def check_lines(text: list[str], lines: int, where: str) -> None:
    """`text` is the program's `lines` lines in order, then its last line; raises if not."""
    if len(text) != lines + 1:
        raise RuntimeError(f"{where} holds {len(text)} lines, expected {lines + 1}")
    for i, line in enumerate(text[:lines]):
        if not line.startswith(f"{i:08d} "):
            raise RuntimeError(f"{where}: line {i} is {line[:40]!r}")


def _store_file(platform: Platform, training_id: str) -> Path:
    """Where the file log store (`dlaas up`'s) keeps learner 1's lines."""
    return platform.home / "logs" / training_id / "learner-1.jsonl"


def _watch_store(path: Path, timeout: float) -> float:
    """When the store's file first ends with the program's last line (polled every 5 ms,
    reading only the file's end, so that the watch costs next to nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 512))
                if b'"wall ' in f.read():
                    return time.time()
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    raise TimeoutError(f"{path} did not get the last line within {timeout:.0f} s")


def through_platform(platform: Platform, lines: int) -> tuple[float, float]:
    """(lines per second reaching the store, the program's own wall time)."""
    followed: list[str] = []
    with platform.client() as http:
        t = platform.submit(
            http, _manifest(f"python3 run.py {lines}"), zip_code({"run.py": PRINTER})
        )

        def follow() -> None:
            # The stream's bytes as they come, cut into lines once it ends: the client
            # shares the platform's two cores here (a user's would not), and httpx cutting
            # lines as they came took as much CPU as the API serving them.
            with http.stream(
                "GET", f"/v1/trainings/{t['id']}/logs", params={"follow": "true"}
            ) as r:
                text = b"".join(r.iter_raw()).decode()
            followed.extend(line.split(" ", 3)[3] for line in text.splitlines() if line)

        follower = threading.Thread(target=follow)
        follower.start()
        arrived = _watch_store(_store_file(platform, t["id"]), timeout=300)
        done = platform.wait(http, t["id"], {"COMPLETED", "FAILED"}, poll=0.25)
        if done["status"] != "COMPLETED":
            raise RuntimeError(f"the training failed: {done['status_message']}")
        follower.join(timeout=300)
        check_lines(followed, lines, "the follower")
        stored = stored_lines(http, t["id"])
        check_lines(stored, lines, "the log store")
    wall, started = _program_times(followed[-1])
    return lines / (arrived - started), wall


def stored_lines(http: httpx.Client, training_id: str) -> list[str]:
    """Every line of the training's log, read page by page through the API."""
    out: list[str] = []
    cursor: str | None = None
    while True:
        params = {"cursor": cursor} if cursor else {}
        r = http.get(f"/v1/trainings/{training_id}/logs", params=params)
        r.raise_for_status()
        out += [line.split(" ", 3)[3] for line in r.text.splitlines()]
        cursor = r.headers.get("X-Next-Cursor")
        if not cursor or not r.text:
            return out


def run(quick: bool) -> list[Row]:
    repeats = 3 if quick else 5
    rates, walls, direct_walls = [], [], []
    with dlaas_up() as platform:
        with platform.client() as http:  # warm-up: the worker's first task starts it
            warm = platform.submit(http, manifest("true"), zip_code({"a.py": ""}))
            platform.wait(http, warm["id"], {"COMPLETED"})
        for i in range(repeats):
            if i % 2:
                direct_walls.append(direct(LINES))
            with profiled(platform.process.pid, f"log-throughput-{i}"):
                rate, wall = through_platform(platform, LINES)
            rates.append(rate)
            walls.append(wall)
            if not i % 2:
                direct_walls.append(direct(LINES))
    rate, wall, by_hand = median(rates), median(walls), median(direct_walls)
    file_rate = LINES / by_hand
    # Compared within a pair, run back to back: the same program has taken 0.65 s and
    # 1.5 s to write its file in one run on this shared machine.
    rate_ratio = median([r / (LINES / d) for r, d in zip(rates, direct_walls, strict=True)])
    wall_ratio = median([d / w for w, d in zip(walls, direct_walls, strict=True)])
    return [
        Row(
            "log_throughput",
            round(rate),
            "lines/s",
            baseline=round(file_rate),
            ratio=round(min(rate_ratio, wall_ratio), 3),
            detail={
                "ratio": "the lower of two medians over the pairs: lines/s to the store / "
                "lines/s to a file, and the program's wall time to a file / through the platform",
                "store_rate_ratio": round(rate_ratio, 3),
                "wall_ratio": round(wall_ratio, 3),
                "learner_wall_s": round(wall, 3),
                "file_wall_s": round(by_hand, 3),
                "store_rates": [round(x) for x in rates],
                "learner_walls_s": [round(x, 3) for x in walls],
                "file_walls_s": [round(x, 3) for x in direct_walls],
                "lines": LINES,
                "line_bytes": 100,
                "log_store": "file (dlaas up's default), followed by one client",
                "metric_regexes": len(METRICS),
                "pairs": repeats,
                "checked": "the store and the follower hold every line, in order",
                "target": "ratio >= 0.8",
            },
        ).emit()
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
