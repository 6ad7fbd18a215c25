"""The learner spec file: what the platform writes is what the wrapper reads, credentials
stay out of every printout, and a file of another shape is refused by name."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from service.domain.records import Secret, SpecError
from service.logs.config import LogSinkConfig
from service.sandbox.limits import Enforcement
from service.storage.config import BucketLocation, StoreConfig
from worker.learner.host import LocalHost
from worker.learner.spec import LearnerSpec


def spec(**overrides: Any) -> LearnerSpec:
    user = StoreConfig(
        kind="s3",
        endpoint="http://127.0.0.1:9000",
        access_key=Secret("AKIAUSER"),
        secret_key=Secret("user-secret"),
        bucket="data",
    )
    fields: dict[str, Any] = {
        "training_id": "t1",
        "learner_id": 2,
        "num_learners": 3,
        "hostname": "learner-2",
        "argv": ["python3", "train.py"],
        "env": {"LEARNER_ID": "2"},
        "model_dir": "/w/model",
        "data_dir": "/w/data",
        "result_dir": "/w/results",
        "log_dir": "/w/logs",
        "checkpoint_dir": "/w/ckpt",
        "model_definition_key": "trainings/t1/model_definition.zip",
        "store": StoreConfig(kind="local", root="/store"),
        "log_sink": LogSinkConfig(kind="file", dir="/logs"),
        "results_prefix": "trainings/t1/results/",
        "training_data": BucketLocation(store=user, prefix="train/"),
        "waits_for_peers": True,
        **overrides,
    }
    return LearnerSpec(**fields)


def test_round_trip_keeps_credentials_only_in_the_file(tmp_path: Path) -> None:
    original = spec()
    path = tmp_path / "spec.json"
    original.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert LearnerSpec.read(path) == original
    on_disk = json.loads(path.read_text())
    assert on_disk["training_data"]["store"]["secret_key"] == "user-secret"
    assert original.training_data is not None
    store = original.training_data.store
    assert store.secret_key is not None and store.secret_key.get_secret_value() == "user-secret"
    for shown in (repr(original), str(original), repr(store), f"{store.secret_key}"):
        assert "user-secret" not in shown and "AKIAUSER" not in shown


def test_secret_of_takes_strings_and_secret_holders() -> None:
    class Holder:
        def get_secret_value(self) -> str:
            return "s3cr3t"

    assert Secret.of(None) is None
    assert Secret.of("x") == Secret("x")
    assert Secret.of(Holder()) == Secret("s3cr3t")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(extra=1), "spec: unknown keys ['extra']"),
        (lambda d: d.pop("hostname"), "spec: hostname is required"),
        (lambda d: d.update(learner_id="2"), "spec.learner_id: str is not allowed"),
        (lambda d: d.update(argv=["python3", 3]), "spec.argv: a list of strings"),
        (lambda d: d.update(env={"A": 1}), "spec.env: string values"),
        (lambda d: d["store"].update(kind="ftp"), "store.kind: 'ftp' is not one of"),
        (lambda d: d["log_sink"].update(kind="syslog"), "log_sink.kind: 'syslog'"),
        (
            lambda d: d["training_data"]["store"].update(secret_key=5),
            "spec.training_data.store.secret_key: int is not allowed",
        ),
        (lambda d: d.update(store="local"), "spec.store: expected an object"),
        (lambda d: d.update(checkpoints_prefix=1), "spec.checkpoints_prefix: int is not"),
        (lambda d: d.update(restore_checkpoints=[]), "spec.restore_checkpoints: list is not"),
    ],
)
def test_a_spec_of_another_shape_is_refused(change: Any, message: str) -> None:
    data = json.loads(spec().to_json())
    change(data)
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        LearnerSpec.from_dict(data)


def test_the_spec_is_the_shared_contract_and_the_host_the_local_mechanisms(
    tmp_path: Path,
) -> None:
    """Status files, rendezvous files and the command's prefix are the local backend's
    (LocalHost), not the learner contract every backend shares."""
    local_only = {"status_file", "ready_file", "wait_for", "notify_socket", "run_prefix"}
    assert local_only.isdisjoint(LearnerSpec.__dataclass_fields__)
    host = LocalHost(
        private_dir="/w/private",
        status_file="/w/private/status.json",
        notify_socket="/w/monitor.sock",
        run_prefix=["nsenter", "-t", "1", "--", "bwrap", "--"],
        ready_file="/r/learner-2.ready",
        wait_for=["/r/learner-1.ready"],
        wait_timeout=30,
        limits=Enforcement(rlimit_as=2**30, cpu_affinity=(0, 1)),
    )
    path = tmp_path / "host.json"
    host.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert LocalHost.read(path) == host
    data = json.loads(path.read_text())
    data["limits"]["cpu_affinity"] = ["0"]
    with pytest.raises(SpecError, match=r"limits\.cpu_affinity"):
        LocalHost.from_dict(data)
    with pytest.raises(SpecError, match=r"host\.run_prefix"):
        LocalHost.from_dict({**json.loads(path.read_text()), "run_prefix": [1]})
