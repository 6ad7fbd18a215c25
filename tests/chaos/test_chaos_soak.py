"""Chaos soak: nothing is lost, nothing ends wrong, nothing is left behind while the
platform's own processes are killed -9 under load.

The API (uvicorn), the Celery worker and the monitor run as separate processes on a fresh
PostgreSQL database and a private Redis (broker and log store). Trainings of known outcome
(KINDS: exit 0, exit 1, a learner killed by SIGKILL, on one or two learners, with and
without a retry_policy) are submitted
over HTTP while a chaos thread kills -9 a random platform process's group every
DLAAS_CHAOS_KILL_EVERY seconds (about) and starts it again a moment later. At the end every
training must be terminal in the state its kind decides, with exactly one terminal entry in
its history, in the attempt its kind decides (every retry counted), every learner ended,
each learner's command started at most once an attempt, and no
learner process, namespace holder or work directory left behind.

DLAAS_CHAOS_TRAININGS (default 30) sets the size (`make chaos` runs 300);
DLAAS_CHAOS_KILL_EVERY (default 3) the seconds between kills; DLAAS_CHAOS_SEED the random
seed; DLAAS_CHAOS_REPORT a path for the JSON report (it is printed either way).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import PG_SERVER, zip_of
from tests.integration.platform_harness import (
    PROCESS_KINDS,
    TERMINAL,
    ProcessPlatform,
    fresh_postgres_database,
    private_redis,
    process_platform,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

TRAININGS = int(os.environ.get("DLAAS_CHAOS_TRAININGS", "30"))
KILL_EVERY = float(os.environ.get("DLAAS_CHAOS_KILL_EVERY", "3"))
SEED = int(os.environ.get("DLAAS_CHAOS_SEED", str(random.randrange(2**32))))
REPORT = os.environ.get("DLAAS_CHAOS_REPORT")

# Learner states a learner of an ended training may be in.
LEARNER_ENDED = {"COMPLETED", "FAILED", "HALTED", "LOST", "STOPPED"}
START_MARK = "chaos-start"

# What each learner's command does: print one start line (to the log store, through its
# wrapper), wait, then end as its training's kind says: `exit:<code>` or `kill` (the
# command SIGKILLs itself, as the kernel's OOM killer would).
LEARNER = f'''
import os, signal, sys, time

outcome, seconds = sys.argv[1], float(sys.argv[2])
if outcome.endswith("-once"):  # this outcome on the first attempt, exit 0 on the next
    mark = os.path.join(os.environ["CHECKPOINT_DIR"], "attempted-" + os.environ["LEARNER_ID"])
    if os.path.exists(mark):  # restored from the last attempt's checkpoints
        outcome = "exit:0"
    else:
        open(mark, "w").close()
        outcome = outcome.removesuffix("-once")
print(
    "{START_MARK} training=%s learner=%s pid=%d"
    % (os.environ["TRAINING_ID"], os.environ["LEARNER_ID"], os.getpid()),
    flush=True,
)
time.sleep(seconds)
if outcome == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(outcome.removeprefix("exit:")))
'''
CODE = zip_of({"learner.py": LEARNER})


@dataclass(frozen=True)
class Kind:
    """A row of the soak: how many learners, how each one ends, and the training state
    that decides. `manifest` is merged into the manifest (room for retry_policy rows)."""

    name: str
    nodes: int
    learners: dict[int, str]  # learner id -> "exit:<code>" or "kill" (+ "-once")
    expected: str
    manifest: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1  # the attempt it ends in (retry_policy)


KINDS = [
    Kind("exit0", 1, {1: "exit:0"}, "COMPLETED"),
    Kind("exit0-2nodes", 2, {1: "exit:0", 2: "exit:0"}, "COMPLETED"),
    Kind("exit1", 1, {1: "exit:1"}, "FAILED"),
    Kind("exit1-2nodes", 2, {1: "exit:0", 2: "exit:1"}, "FAILED"),
    Kind("killed", 1, {1: "kill"}, "FAILED"),
    Kind("killed-2nodes", 2, {1: "exit:0", 2: "kill"}, "FAILED"),
    # Retries: a learner lost (or exiting 3) on the first attempt only resumes and completes
    # on the second, its CHECKPOINT_DIR restored; one lost every time uses its retry up.
    Kind(
        "killed-retried-2nodes",
        2,
        {1: "exit:0", 2: "kill-once"},
        "COMPLETED",
        {"retry_policy": {"max_retries": 1, "retry_on_lost": True}},
        attempts=2,
    ),
    Kind(
        "exit3-retried",
        1,
        {1: "exit:3-once"},
        "COMPLETED",
        {"retry_policy": {"max_retries": 2, "retry_on_exit_codes": [3]}},
        attempts=2,
    ),
    Kind(
        "killed-retries-used-up",
        1,
        {1: "kill"},
        "FAILED",
        {"retry_policy": {"max_retries": 1, "retry_on_lost": True}},
        attempts=2,
    ),
]


def manifest(kind: Kind, name: str, seconds: float) -> dict[str, Any]:
    per_learner = " ".join(f"{lid}={outcome}" for lid, outcome in kind.learners.items())
    # The shell picks this learner's outcome from the table by $LEARNER_ID.
    command = (
        f'for o in {per_learner}; do [ "${{o%%=*}}" = "$LEARNER_ID" ] && outcome="${{o#*=}}"; '
        f'done; exec python3 learner.py "$outcome" {seconds:.2f}'
    )
    doc: dict[str, Any] = {
        "name": name,
        "framework": {"name": "tensorflow", "version": "2.21", "command": command},
        "compute_configuration": {"name": "P100", "nodes": kind.nodes},
    }
    if kind.nodes > 1:
        doc["framework"]["parameter_servers"] = 0
    doc.update(kind.manifest)
    return doc


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[ProcessPlatform]:
    with (
        fresh_postgres_database(PG_SERVER, "dlaas_chaos") as database_url,
        private_redis(tmp_path / "redis") as redis_url,
        process_platform(tmp_path / "home", database_url, redis_url) as live,
    ):
        yield live


class Chaos:
    """kill -9 a random platform process (its whole group) every few seconds, and start
    it again after a short moment."""

    def __init__(self, live: ProcessPlatform, every: float, rng: random.Random) -> None:
        self.live = live
        self.every = every
        self.rng = rng
        self.kills: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Chaos:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for kind in PROCESS_KINDS:  # whatever was down comes back for the wrap-up
            if not self.live.running(kind):
                self.live.start(kind)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every * self.rng.uniform(0.5, 1.5)):
                kind = self.rng.choice(PROCESS_KINDS)
                if not self.live.running(kind):
                    continue
                self.live.kill(kind)
                self.kills[kind] += 1
                time.sleep(self.rng.uniform(0.2, 1.5))  # down for a moment
                self.live.start(kind)
        except BaseException as e:  # reported by the test
            self.error = e


def list_trainings(live: ProcessPlatform) -> list[dict[str, Any]]:
    assert live.client is not None
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        r = live.client.request("GET", "/v1/trainings", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        out.extend(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def processes_of(home: Path, training_ids: set[str]) -> tuple[dict[str, list[int]], list[int]]:
    """One pass over /proc: the live processes of each training (as
    platform_harness.training_processes finds them), and every live process started with
    this platform's DLAAS_HOME (the platform's processes and what they started: learner
    network holders and their sleepers among them)."""
    by_training: dict[str, list[int]] = defaultdict(list)
    of_home: list[int] = []
    home_var = f"DLAAS_HOME={home}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if home_var in environ:
            of_home.append(int(entry.name))
        for var in environ:
            if var.startswith(b"TRAINING_ID="):
                tid = var.removeprefix(b"TRAINING_ID=").decode(errors="replace")
                if tid in training_ids:
                    by_training[tid].append(int(entry.name))
        if b"/work/" in cmdline:
            for tid in training_ids:
                if f"/work/{tid}/".encode() in cmdline:
                    by_training[tid].append(int(entry.name))
    return dict(by_training), of_home


def describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmd = "?"
    return f"{pid}: {cmd[:200]}"


def start_lines(log_text: str) -> Counter[int]:
    """How many times each learner's command started, from its start lines."""
    starts: Counter[int] = Counter()
    for line in log_text.splitlines():
        if START_MARK in line:
            fields = dict(f.split("=", 1) for f in line.split(START_MARK, 1)[1].split() if "=" in f)
            starts[int(fields["learner"])] += 1
    return starts


def test_nothing_is_lost_under_faults(platform: ProcessPlatform) -> None:
    live = platform
    client = live.client
    assert client is not None
    rng = random.Random(SEED)
    began = time.monotonic()
    planned = {
        f"chaos-{i:04d}-{kind.name}": (kind, rng.uniform(0.3, 2.5))
        for i, kind in enumerate(rng.choice(KINDS) for _ in range(TRAININGS))
    }
    kind_of = {name: kind for name, (kind, _) in planned.items()}
    unsubmitted: list[str] = []
    deadline = time.monotonic() + 150 + 4 * TRAININGS

    with Chaos(live, KILL_EVERY, rng) as chaos:
        for name, (kind, seconds) in planned.items():
            files = {
                "manifest": ("manifest.yaml", yaml.safe_dump(manifest(kind, name, seconds))),
                "model_definition": ("code.zip", CODE),
            }
            try:
                r = client.request("POST", "/v1/trainings", files=files)
            except AssertionError:
                unsubmitted.append(name)
                continue
            assert r.status_code == 201, r.text
        # Every training (retried submissions included) until all are terminal.
        while True:
            trainings = list_trainings(live)
            pending = [t for t in trainings if t["status"] not in TERMINAL]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(1)
        ran_for = time.monotonic() - began
    assert chaos.error is None, repr(chaos.error)

    # Wrap-up with every process up and no more kills: the learners' end is recorded and
    # what they leave is cleaned up.
    ids = {t["id"] for t in trainings}
    settle = time.monotonic() + 90
    while True:
        views = {tid: client.request("GET", f"/v1/trainings/{tid}").json() for tid in sorted(ids)}
        procs, _ = processes_of(live.home, ids)
        dirs = {tid for tid in ids if (live.home / "work" / tid).exists()}
        open_learners = {
            tid
            for tid, v in views.items()
            if any(lr["status"] not in LEARNER_ENDED for lr in v["learners"])
        }
        if (not procs and not dirs and not open_learners) or time.monotonic() > settle:
            break
        time.sleep(1)
    logs = {tid: client.request("GET", f"/v1/trainings/{tid}/logs").text for tid in sorted(ids)}
    live.stop_all()
    _, home_procs = processes_of(live.home, ids)

    # -- judge ---------------------------------------------------------------------------
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for v in views.values():
        by_name[v["name"]].append(v)
    lost: list[str] = [f"{name}: never submitted (the API did not answer)" for name in unsubmitted]
    lost += [
        f"{name}: no such training"
        for name in planned
        if name not in by_name and name not in unsubmitted
    ]
    wrong: list[str] = []
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    retries: Counter[str] = Counter()
    for name, found in sorted(by_name.items()):
        row = kind_of.get(name)
        if row is None:
            wrong.append(f"{name}: a training nobody submitted")
            continue
        for v in found:
            tid, status = v["id"], v["status"]
            outcomes[row.name][status] += 1
            if status not in TERMINAL:
                lost.append(f"{name} {tid}: still {status} ({v['status_message']})")
                continue
            if status != row.expected:
                wrong.append(f"{name} {tid}: {status}, not {row.expected}: {v['status_message']}")
            ends = [h["status"] for h in v["status_history"] if h["status"] in TERMINAL]
            if len(ends) != 1:
                wrong.append(f"{name} {tid}: terminal entries {ends}")
            open_ = [
                (lr["learner_id"], lr["status"])
                for lr in v["learners"]
                if lr["status"] not in LEARNER_ENDED
            ]
            if open_:
                wrong.append(f"{name} {tid}: learners not ended {open_}")
            if v["attempt"] != row.attempts or len(v["past_attempts"]) != row.attempts - 1:
                wrong.append(
                    f"{name} {tid}: attempt {v['attempt']} with {len(v['past_attempts'])} past "
                    f"attempts, not attempt {row.attempts}"
                )
            retries[row.name] += v["attempt"] - 1
            starts = start_lines(logs[tid])
            twice = {lid: n for lid, n in starts.items() if n > v["attempt"]}
            if twice:
                wrong.append(f"{name} {tid}: learners started more than once an attempt {twice}")
            if status == "COMPLETED" and set(starts) != set(row.learners):
                wrong.append(f"{name} {tid}: completed but started learners {dict(starts)}")
    leftovers = [
        f"{tid} ({views[tid]['status']}): processes {[describe(p) for p in pids]}"
        for tid, pids in procs.items()
    ]
    leftovers += [f"{tid} ({views[tid]['status']}): work directory left" for tid in sorted(dirs)]
    leftovers += [f"process of the platform's home left: {describe(p)}" for p in home_procs]

    report = {
        "trainings": TRAININGS,
        "submitted": len(views),
        "resubmitted": sum(len(v) - 1 for v in by_name.values()),
        "seed": SEED,
        "kill_every_s": KILL_EVERY,
        "outcomes": {k: dict(c) for k, c in sorted(outcomes.items())},
        "retries": dict(sorted(retries.items())),
        "kills": {process: chaos.kills[process] for process in PROCESS_KINDS},
        "process_starts": dict(live.starts),
        "client_retries": client.retries,
        "lost": lost,
        "wrong": wrong,
        "leftovers": leftovers,
        "soak_s": round(ran_for, 1),
        "duration_s": round(time.monotonic() - began, 1),
    }
    text = json.dumps(report, indent=2)
    print(f"\nchaos soak report\n{text}")
    if REPORT:
        Path(REPORT).write_text(text + "\n")
    tails = "\n".join(f"--- {k}.log\n{live.log_tail(k)}" for k in PROCESS_KINDS)
    # What the platform's processes said of each training that went wrong.
    suspects = {tid for tid in ids if any(tid in line for line in [*lost, *wrong, *leftovers])}
    for process in PROCESS_KINDS:
        said = live.log_tail(process, chars=10**8).splitlines()
        for tid in sorted(suspects):
            mentions = [line[:300] for line in said if tid in line]
            tails += f"\n--- {process}.log on {tid}\n" + "\n".join(mentions[-10:])
    assert sum(chaos.kills.values()) > 0, report
    assert not lost and not wrong and not leftovers, f"{text}\n{tails}"
