"""How fast the platform reacts: submit → every learner RUNNING, a learner's exit → the
API reporting the terminal state, a printed line → a `logs?follow=true` client.

    python benchmarks/latency.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Platform, Row, dlaas_up, manifest, median, percentile, zip_code

SLEEPER = zip_code({"run.py": "import time\ntime.sleep(600)\n"})
EXITER = zip_code({"run.py": "import time\nprint('exit_at', repr(time.time()), flush=True)\n"})
TICKER = zip_code(
    {
        "run.py": (
            "import sys, time\n"
            "n = int(sys.argv[1])\n"
            "for i in range(n):\n"
            "    print('sent', repr(time.time()), flush=True)\n"
            "    time.sleep(0.05)\n"
        )
    }
)


def submit_to_running(platform: Platform, repeats: int) -> Row:
    samples = []
    with platform.client() as http:
        for _ in range(repeats):
            t = platform.submit(
                http, manifest("python3 run.py", nodes=2, parameter_servers=0), SLEEPER
            )
            returned = time.monotonic()
            while True:
                body = http.get(f"/v1/trainings/{t['id']}").json()
                if all(lr["status"] == "RUNNING" for lr in body["learners"]):
                    samples.append(time.monotonic() - returned)
                    break
                if body["status"] in ("FAILED", "HALTED", "COMPLETED"):
                    raise RuntimeError(f"training ended: {body['status_message']}")
                time.sleep(0.005)
            http.post(f"/v1/trainings/{t['id']}/stop")
            platform.wait(http, t["id"], {"HALTED"})
    return Row(
        "submit_to_running_p50",
        round(median(samples), 3),
        "s",
        detail={"samples": [round(s, 3) for s in samples], "learners": 2, "target": "<= 0.5"},
    )


def status_propagation(platform: Platform, repeats: int) -> Row:
    samples = []
    with platform.client() as http:
        for _ in range(repeats):
            t = platform.submit(http, manifest("python3 run.py"), EXITER)
            done = platform.wait(http, t["id"], {"COMPLETED", "FAILED"})
            seen = time.time()
            assert done["status"] == "COMPLETED", done
            logs = http.get(f"/v1/trainings/{t['id']}/logs").text
            exit_at = float(logs.split("exit_at ")[1].split()[0])
            samples.append(seen - exit_at)
    return Row(
        "status_propagation_p99",
        round(percentile(samples, 99), 3),
        "s",
        detail={"median": round(median(samples), 3), "runs": repeats, "target": "<= 1"},
    )


def log_latency(platform: Platform, lines: int) -> Row:
    delays: list[float] = []
    with platform.client() as http:
        t = platform.submit(http, manifest(f"python3 run.py {lines}"), TICKER)

        def follow() -> None:
            with http.stream(
                "GET", f"/v1/trainings/{t['id']}/logs", params={"follow": "true"}
            ) as r:
                for line in r.iter_lines():
                    if " sent " in line:
                        delays.append(time.time() - float(line.split(" sent ")[1]))

        reader = threading.Thread(target=follow)
        reader.start()
        reader.join(timeout=300)
    if len(delays) != lines:
        raise RuntimeError(f"the follower saw {len(delays)} of {lines} lines")
    return Row(
        "log_latency_p99",
        round(percentile(delays, 99), 3),
        "s",
        detail={"median": round(median(delays), 3), "lines": lines, "target": "<= 0.2"},
    )


def run(quick: bool) -> list[Row]:
    with dlaas_up() as platform:
        return [
            submit_to_running(platform, 5 if quick else 15).emit(),
            status_propagation(platform, 5 if quick else 20).emit(),
            log_latency(platform, 60 if quick else 200).emit(),
        ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
