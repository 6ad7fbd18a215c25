"""TensorBoard scalars as users see them: a training on a `dlaas up` subprocess writes them
with `tf.summary` (examples/tensorboard); while it runs they are in GET .../metrics, and
`dlaas tensorboard` serves them (TensorBoard's own scalars endpoint)."""

from __future__ import annotations

import itertools
import math
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.e2e.test_up import DLAAS, ROOT, Up, alive, free_port, start_up
from tests.integration.platform_harness import descendants

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "examples" / "tensorboard"
STEPS = 5
T = TypeVar("T")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    platform = start_up(tmp_path / "home", DLAAS_LOG_DIR_SYNC_SECONDS="1")
    try:
        yield platform
    finally:
        platform.stop()  # Ctrl-C: a training still running is halted, its learner stopped
        platform.kill()


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 180) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := probe()) is not None:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_tf_summary_scalars_are_metrics_while_it_runs_and_tensorboard_serves_them(
    up: Up, tmp_path: Path
) -> None:
    client = up.client()
    manifest: dict[str, Any] = {
        "name": "tensorboard",
        "framework": {
            "name": "tensorflow",
            "version": "2.21",
            # Lingers after its last step: everything below happens while it runs.
            "command": f"python3 train.py --steps {STEPS} --linger 600",
        },
        "compute_configuration": {"name": "K80", "nodes": 1},
        "evaluation_metrics": {"type": "tensorboard", "in": "$JOB_STATE_DIR/logs/tb"},
    }
    training = client.trainings.create(manifest, EXAMPLE)

    def all_steps() -> dict[str, Any] | None:
        found = client.trainings.metrics(training.id)
        if len(found.get("train/loss", [])) < STEPS:
            now = client.trainings.get(training.id)
            assert not now.terminal, (now, list(client.trainings.logs(training.id)))
            return None
        return found

    metrics = eventually(all_steps, "the scalars in GET .../metrics")
    assert client.trainings.get(training.id).status == "RUNNING"
    assert set(metrics) == {"train/loss", "train/weight"}
    loss = metrics["train/loss"]
    assert [p.step for p in loss] == list(range(STEPS))
    assert {p.learner for p in loss} == {1}
    assert all(b.value < a.value for a, b in itertools.pairwise(loss))  # it learns
    # The same values as the training printed (`step=<n> loss=<v>`, 6 decimals).
    printed = {
        int(line.split("step=")[1].split()[0]): float(line.split("loss=")[1])
        for line in client.trainings.logs(training.id)
        if "] step=" in line
    }
    assert [round(p.value, 6) for p in loss] == [printed[s] for s in range(STEPS)]

    # `dlaas tensorboard` mirrors LOG_DIR (learner-1/ as the run) and serves it.
    port = free_port()
    logdir = tmp_path / "tb"
    board = subprocess.Popen(
        [DLAAS, "tensorboard", training.id, "--logdir", str(logdir), "--port", str(port)],
        env=up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert board.stdout is not None
        lines.extend(board.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        url = f"http://127.0.0.1:{port}/"
        eventually(
            lambda: True if any(url in line for line in lines) else None,
            "`dlaas tensorboard` to print its URL",
        )
        assert (logdir / "learner-1" / "train").is_dir()

        def served() -> list[list[float]] | None:
            r = httpx.get(
                f"{url}data/plugin/scalars/scalars",
                params={"run": "learner-1/train", "tag": "loss"},
                timeout=10,
            )
            if r.status_code != 200 or len(r.json()) < STEPS:
                return None
            points: list[list[float]] = r.json()
            return points

        scalars = eventually(served, "TensorBoard's scalars of learner-1/train")
        assert [int(step) for _, step, _ in scalars] == list(range(STEPS))
        for (_, _, value), point in zip(scalars, loss, strict=True):
            assert math.isclose(value, point.value, rel_tol=1e-6)

        started = descendants(board.pid)  # TensorBoard and its data server
        assert started
        board.send_signal(signal.SIGINT)  # Ctrl-C
        assert board.wait(60) == 0, "".join(lines)
        assert not [pid for pid in started if alive(pid)], "TensorBoard outlived it"
        reader.join(10)
        assert "Traceback" not in "".join(lines)
        with pytest.raises(httpx.TransportError):  # TensorBoard stopped with it
            httpx.get(url, timeout=5)
    finally:
        if board.poll() is None:
            board.kill()
            board.wait()
        client.trainings.stop(training.id)
        assert client.trainings.wait(training.id, timeout=60).status == "HALTED"
