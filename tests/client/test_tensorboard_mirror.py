"""`dlaas tensorboard`'s mirror of a training's LOG_DIR through the REST API (the client
against the real app): every learner's files under learner-<i>/, only what changed fetched
again, a grown event file completed in place with a Range request."""

from __future__ import annotations

import io
import time
from pathlib import Path

from dlaas import Client
from dlaas.tensorboard import LogDirMirror
from service.platform import Platform
from tests.client.test_client import manifest, zip_bytes

EVENTS = "train/events.out.tfevents.1.host.1.v2"


def _put(platform: Platform, key: str, data: bytes) -> None:
    platform.store.put_stream(key, io.BytesIO(data), len(data))


def test_the_mirror_keeps_every_learners_log_dir_and_appends_to_grown_event_files(
    me: Client, platform: Platform, tmp_path: Path
) -> None:
    training = me.trainings.create(manifest(), zip_bytes({"train.py": "print('hi')\n"}))
    prefix = f"trainings/{training.id}/results/"
    _put(platform, f"{prefix}learner-1/logs/{EVENTS}", b"first")
    _put(platform, f"{prefix}learner-2/logs/notes.txt", b"two")
    _put(platform, f"{prefix}learner-1/training-log.txt", b"not LOG_DIR")
    _put(platform, f"{prefix}model/saved_model.pb", b"not LOG_DIR either")
    root = tmp_path / "tb"
    mirror = LogDirMirror(me, training.id, root)

    assert mirror.sync() == 2
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert files == {f"learner-1/{EVENTS}": b"first", "learner-2/notes.txt": b"two"}
    assert mirror.sync() == 0  # nothing changed, nothing fetched

    event_file = root / "learner-1" / EVENTS
    inode = event_file.stat().st_ino
    time.sleep(0.01)
    _put(platform, f"{prefix}learner-1/logs/{EVENTS}", b"first, then more")
    assert mirror.sync() == 1
    assert event_file.read_bytes() == b"first, then more"
    assert event_file.stat().st_ino == inode  # the same file for TensorBoard, which has it open

    _put(platform, f"{prefix}learner-2/logs/notes.txt", b"rewritten, longer")
    assert mirror.sync() == 1
    assert (root / "learner-2" / "notes.txt").read_bytes() == b"rewritten, longer"


def test_a_ranged_result_is_appended_and_a_whole_one_replaces(
    me: Client, platform: Platform
) -> None:
    training = me.trainings.create(manifest(), zip_bytes({"train.py": "print('hi')\n"}))
    _put(platform, f"trainings/{training.id}/results/learner-1/logs/a.txt", b"0123456789")
    out = io.BytesIO(b"0123")
    out.seek(4)
    assert me.trainings.result(training.id, "learner-1/logs/a.txt", out, offset=4)
    assert out.getvalue() == b"0123456789"
    whole = io.BytesIO()
    assert me.trainings.result(training.id, "learner-1/logs/a.txt", whole)
    assert whole.getvalue() == b"0123456789"


def test_results_outside_a_learners_log_dir_are_not_mirrored(tmp_path: Path) -> None:
    mirror = LogDirMirror(None, "t", tmp_path)  # type: ignore[arg-type]
    assert mirror.local_path("learner-3/logs/run/x") == tmp_path / "learner-3" / "run" / "x"
    for path in (
        "learner-1/training-log.txt",
        "model/x",
        "learner-0/logs/x",
        "learner-1/logs/../x",
    ):
        assert mirror.local_path(path) is None
