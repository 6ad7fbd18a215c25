"""TensorBoard scalars as metrics: the manifest's `{type: tensorboard}`, the learner's reader
of event files (TensorBoard's EventFileLoader, on files TensorBoard's own writer wrote, as
they grow, partial and corrupt), the document it stores and the check the API makes of it,
and the incremental upload of LOG_DIR."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.histogram.summary_v2 import histogram_pb
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from service.domain import metrics as domain_metrics
from service.domain.catalog import DEFAULT_CATALOG
from service.domain.manifest import load_manifest, tensorboard_metrics
from service.domain.metrics import parse_tensorboard_document
from service.errors import ValidationFailed
from service.logs.config import LogSinkConfig
from service.storage.config import StoreConfig
from service.storage.local import LocalObjectStore
from worker.learner import scalars
from worker.learner.logdir import LogDirSync
from worker.learner.scalars import ScalarReader
from worker.learner.spec import LearnerSpec
from worker.learner.transfers import Transfers

REPO = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {
    "name": "tb",
    "framework": {"name": "tensorflow", "version": "2.21", "command": "python3 train.py"},
    "compute_configuration": {"name": "K80", "nodes": 1},
}


class Writer:
    """TensorBoard's own event file writer, one file in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._writer = EventFileWriter(str(directory))

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.event(step, scalar_pb(tag, value))

    def event(self, step: int, summary: Summary) -> None:
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    @property
    def path(self) -> Path:
        return next(p for p in self.directory.iterdir() if "tfevents" in p.name)


def values(reader: ScalarReader, name: str) -> list[tuple[int, float]]:
    return [(int(step), round(value, 5)) for step, _, value in reader.points[name]]


# -- the manifest ---------------------------------------------------------------------------


def test_an_ffdl_style_tensorboard_manifest_is_accepted_and_stored_as_written() -> None:
    manifest = load_manifest(
        {**BASE, "evaluation_metrics": {"type": "tensorboard", "in": "$JOB_STATE_DIR/logs/tb"}},
        DEFAULT_CATALOG,
        "standard",
    )
    assert manifest.tensorboard_metrics
    document = manifest.model_dump(mode="json", exclude_none=True, by_alias=True)
    assert document["evaluation_metrics"] == {"type": "tensorboard", "in": "$JOB_STATE_DIR/logs/tb"}
    assert tensorboard_metrics(document)
    regexes = load_manifest(
        {**BASE, "evaluation_metrics": [{"name": "loss", "regex": "loss=([0-9.]+)"}]},
        DEFAULT_CATALOG,
        "standard",
    )
    assert not regexes.tensorboard_metrics
    assert not tensorboard_metrics(regexes.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("metrics", "field"),
    [
        ({"type": "tensorbored"}, "/evaluation_metrics/type"),
        ({"type": "tensorboard", "event_types": ["scalars"]}, "/evaluation_metrics/event_types"),
        ({"in": "logs"}, "/evaluation_metrics/type"),
        ([{"name": "loss", "regex": 1}], "/evaluation_metrics/0/regex"),
        ([{"name": "loss", "regex": "(a)(b)"}], "/evaluation_metrics/0/regex"),
        ("tensorboard", "/evaluation_metrics"),
    ],
)
def test_a_wrong_evaluation_metrics_names_the_field_as_written(metrics: Any, field: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        load_manifest({**BASE, "evaluation_metrics": metrics}, DEFAULT_CATALOG, "standard")
    assert [e.field for e in refused.value.errors] == [field]


# -- the reader -----------------------------------------------------------------------------


def test_scalars_of_every_run_are_read_with_their_steps_and_only_new_ones_each_pass(
    tmp_path: Path,
) -> None:
    train, top = Writer(tmp_path / "train"), Writer(tmp_path)
    for step in range(3):
        train.scalar("loss", 1 / (step + 1), step)
    top.scalar("accuracy", 0.5, 7)
    # TensorFlow 1's simple_value, and a histogram, which is not a scalar.
    top.event(8, Summary(value=[Summary.Value(tag="old", simple_value=2.5)]))
    top.event(9, histogram_pb("weights", [1.0, 2.0, 3.0]))
    reader = ScalarReader(tmp_path)
    assert reader.read() == 5
    assert values(reader, "train/loss") == [(0, 1.0), (1, 0.5), (2, 0.33333)]
    assert values(reader, "accuracy") == [(7, 0.5)]
    assert values(reader, "old") == [(8, 2.5)]
    assert "weights" not in reader.points
    assert reader.read() == 0
    train.scalar("loss", 0.25, 3)
    assert reader.read() == 1
    assert values(reader, "train/loss")[-1] == (3, 0.25)


def test_the_reader_does_not_load_tensorflow(tmp_path: Path) -> None:
    Writer(tmp_path).scalar("loss", 1.0, 0)
    code = (
        "import sys; from pathlib import Path; from worker.learner.scalars import ScalarReader; "
        f"r = ScalarReader(Path({str(tmp_path)!r})); print(r.read(), 'tensorflow' in sys.modules)"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert ran.stdout.split() == ["1", "False"]  # TensorBoard's own record reader, not TF's


@pytest.mark.parametrize("wrapper", ["worker.learner.phases", "worker.learner.pod_steps"])
def test_a_learner_wrapper_imports_tensorboard_only_for_a_training_that_reads_it(
    wrapper: str,
) -> None:
    """TensorBoard's reader takes a third of a second to import, before a learner's command
    starts: only a LogDirSync whose training reads TensorBoard metrics imports it."""
    code = (
        f"import sys, {wrapper}; print('tensorboard' in sys.modules); "
        "from worker.learner.logdir import LogDirSync; import worker.learner.scalars; "
        "print('tensorboard' in sys.modules)"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert ran.stdout.split() == ["False", "True"]


def test_a_partial_record_is_read_once_it_is_complete(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    writer.scalar("loss", 1.0, 0)
    writer.scalar("loss", 0.5, 1)
    writer.close()
    path = writer.path
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # the writer is in the middle of its last record
    reader = ScalarReader(tmp_path)
    assert reader.read() == 1
    with path.open("ab") as f:
        f.write(whole[-7:])
    assert reader.read() == 1
    assert values(reader, "loss") == [(0, 1.0), (1, 0.5)]


def test_a_corrupt_record_ends_that_file_only(tmp_path: Path) -> None:
    bad, good = Writer(tmp_path / "bad"), Writer(tmp_path / "good")
    bad.scalar("loss", 1.0, 0)
    good.scalar("loss", 2.0, 0)
    bad.close()
    data = bytearray(bad.path.read_bytes())
    # A record whose data does not match its checksum, then a record that is not an Event.
    payload = b"\x01" * 16
    header = struct.pack("<Q", len(payload))
    data += header + b"\0\0\0\0" + payload + b"\0\0\0\0"
    bad.path.write_bytes(bytes(data))
    reader = ScalarReader(tmp_path)
    reader.read()
    good.scalar("loss", 3.0, 1)
    reader.read()
    assert values(reader, "bad/loss") == [(0, 1.0)]
    assert values(reader, "good/loss") == [(0, 2.0), (1, 3.0)]


def test_a_file_that_is_no_event_file_at_all_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "events.out.tfevents.1.garbage").write_bytes(b"\xff" * 64)
    writer = Writer(tmp_path / "run")
    writer.scalar("loss", 1.0, 0)
    reader = ScalarReader(tmp_path)
    reader.read()
    assert values(reader, "run/loss") == [(0, 1.0)]


def test_an_event_file_over_the_cap_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(scalars, "MAX_EVENT_FILE_BYTES", 64)
    writer = Writer(tmp_path)
    for step in range(5):
        writer.scalar("loss", 1.0, step)
    reader = ScalarReader(tmp_path)
    assert reader.read() == 0
    assert "larger than 64 bytes" in capsys.readouterr().err


def test_points_beyond_the_cap_are_dropped_and_the_document_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scalars, "MAX_TENSORBOARD_POINTS", 3)
    writer = Writer(tmp_path)
    for step in range(5):
        writer.scalar("loss", float(step), step)
    reader = ScalarReader(tmp_path)
    reader.read()
    document = reader.document(2)
    assert document["truncated"] is True and document["learner"] == 2
    assert [p[0] for p in document["metrics"]["loss"]] == [0, 1, 2]
    parsed = parse_tensorboard_document(json.dumps(document).encode())
    assert [p.step for p in parsed["loss"]] == [0, 1, 2]


# -- the stored document --------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"format": 2, "metrics": {}}',
        b'{"format": 1}',
        b'{"format": 1, "metrics": {"loss": {}}}',
        b'{"format": 1, "metrics": {"loss": [[1, 2]]}}',
        b'{"format": 1, "metrics": {"loss": [[1.5, 2, 3]]}}',
        b'{"format": 1, "metrics": {"loss": [[1, 2, "3"]]}}',
        b'{"format": 1, "metrics": {"loss": [[true, 2, 3]]}}',
        b'{"format": 1, "metrics": {"loss": [[1, 2, NaN]]}}',
    ],
)
def test_a_document_not_as_the_learner_writes_it_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_tensorboard_document(data)


def test_a_document_over_the_size_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(domain_metrics, "MAX_TENSORBOARD_DOCUMENT_BYTES", 10)
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        parse_tensorboard_document(b'{"format": 1, "metrics": {}}')


# -- LOG_DIR synced while the command runs ---------------------------------------------------


class CountingStore(LocalObjectStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: list[str] = []

    def put_stream(self, key: str, stream: BinaryIO, length: int | None = None) -> Any:
        if "/metrics/" not in key:  # the files synced, not the metrics document
            self.puts.append(key)
        return super().put_stream(key, stream, length)


def spec(tmp_path: Path, **overrides: Any) -> LearnerSpec:
    fields: dict[str, Any] = {
        "training_id": "t1",
        "learner_id": 1,
        "num_learners": 1,
        "hostname": "learner-1",
        "argv": ["true"],
        "env": {},
        "model_dir": str(tmp_path / "model"),
        "data_dir": str(tmp_path / "data"),
        "result_dir": str(tmp_path / "result"),
        "log_dir": str(tmp_path / "logs"),
        "checkpoint_dir": str(tmp_path / "checkpoint"),
        "model_definition_key": "trainings/t1/model_definition.zip",
        "store": StoreConfig(kind="local", root=str(tmp_path / "store")),
        "log_sink": LogSinkConfig(kind="file", dir=str(tmp_path / "logsink")),
        "results_prefix": "trainings/t1/results/",
        **overrides,
    }
    return LearnerSpec(**fields)


def test_each_pass_uploads_only_new_and_changed_files_and_storing_only_what_is_left(
    tmp_path: Path,
) -> None:
    learner = spec(tmp_path, tensorboard_metrics=True)
    logs = Path(learner.log_dir)
    logs.mkdir()
    store = CountingStore(tmp_path / "store")
    transfers = Transfers(learner, tmp_path / "private", tmp_path / "private" / "log.txt")
    sync = LogDirSync(learner, transfers, store)
    (logs / "a.txt").write_text("a")
    writer = Writer(logs / "train")
    writer.scalar("loss", 1.0, 0)
    sync.sync()
    prefix = "trainings/t1/results/learner-1/logs/"
    assert sorted(store.puts) == sorted([f"{prefix}a.txt", f"{prefix}train/{writer.path.name}"])
    key = "trainings/t1/metrics/learner-1/tensorboard.json"
    with store.open(key) as f:
        stored = parse_tensorboard_document(f.read())
    assert [p.step for p in stored["train/loss"]] == [0]

    store.puts.clear()
    sync.sync()
    assert store.puts == []  # nothing changed: nothing uploaded
    writer.scalar("loss", 0.5, 1)
    sync.sync()
    assert store.puts == [f"{prefix}train/{writer.path.name}"]
    with store.open(key) as f:
        assert [p.step for p in parse_tensorboard_document(f.read())["train/loss"]] == [0, 1]

    store.puts.clear()
    (logs / "b.txt").write_text("b")
    errors = transfers.store(store, list(transfers.files_to_upload()))
    assert errors == []
    assert store.puts == [f"{prefix}b.txt"]  # STORING: only what no pass uploaded


def test_the_thread_syncs_every_interval_and_stop_makes_a_last_pass(tmp_path: Path) -> None:
    learner = spec(tmp_path, log_dir_sync_seconds=0.05)
    logs = Path(learner.log_dir)
    logs.mkdir()
    store = CountingStore(tmp_path / "store")
    transfers = Transfers(learner, tmp_path / "private", tmp_path / "private" / "log.txt")
    sync = LogDirSync(learner, transfers, store)
    sync.start()
    try:
        (logs / "early.txt").write_text("x")
        deadline = time.monotonic() + 10
        while not store.puts and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.puts == ["trainings/t1/results/learner-1/logs/early.txt"]
        (logs / "late.txt").write_text("y")
    finally:
        sync.stop()
    assert "trainings/t1/results/learner-1/logs/late.txt" in store.puts
    # No TensorBoard metrics asked for: none stored.
    assert store.stat("trainings/t1/metrics/learner-1/tensorboard.json") is None
