"""Trainings on S3 end to end: the platform's store is a real S3 endpoint (moto's server),
the training data comes from a user's bucket and the results also go to one; failures of
users' stores (a redirect among them) fail the training with a reason naming the store and
the bucket, and the learner checks a user's endpoint again when it connects."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.db.models import Training
from service.domain.lifecycle import LearnerObservation
from service.domain.records import Secret
from service.domain.states import TrainingState
from service.logs.config import LogSinkConfig
from service.platform import Platform
from service.storage import endpoints
from service.storage.config import BucketLocation, StoreConfig
from service.trainings import record_transition
from tests.conftest import submit, zip_of
from tests.fakes import Learners
from tests.integration.platform_harness import LivePlatform, live_platform
from tests.s3_server import (
    ACCESS_KEY,
    SECRET_KEY,
    S3Server,
    free_port,
    moto_server,
    stub_server,
)
from worker.backends.base import Observation
from worker.learner.host import FileRendezvous
from worker.learner.phases import Learner
from worker.learner.spec import LearnerSpec
from worker.learner.status import FileStatusReporter
from worker.learner.transfers import PlatformError, Transfers
from worker.monitor import Monitor

pytestmark = pytest.mark.integration

USER_KEY = "AKIA-USER-k2Lm"
USER_SECRET = "user-secret-Wp7Tz"
DATA = {
    "train/a.txt": b"alpha",
    "train/sub/b.bin": os.urandom(300 * 1024),
    "train/sub/": b"",  # a "folder" marker: not a file
    "train-extra/d.txt": b"beside the prefix, not below it",
    "other/c.txt": b"elsewhere",
}
TRAIN_PY = """
import hashlib, os, pathlib, sys, time
data = pathlib.Path(os.environ["DATA_DIR"])
res = pathlib.Path(os.environ["RESULT_DIR"])
lines = [
    f"{p.relative_to(data)} {p.stat().st_size} {hashlib.sha256(p.read_bytes()).hexdigest()}"
    for p in sorted(data.rglob("*")) if p.is_file()
]
(res / "data-listing.txt").write_text("\\n".join(lines) + "\\n")
(res / "model").mkdir(exist_ok=True)
(res / "model" / "saved_model.pb").write_bytes(b"model bytes")
print("listed", len(lines), "files", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""
CODE = zip_of({"train.py": TRAIN_PY})


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        server.make_bucket("user-data", DATA)
        server.make_bucket("user-results")
        yield server


@pytest.fixture(scope="module")
def live(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    tmp = tmp_path_factory.mktemp("s3-platform")
    with live_platform(
        tmp / "home",
        f"sqlite:///{tmp / 'dlaas.db'}",
        DLAAS_S3_ENDPOINT=s3.url,
        DLAAS_S3_ACCESS_KEY=ACCESS_KEY,
        DLAAS_S3_SECRET_KEY=SECRET_KEY,
        DLAAS_S3_BUCKET="platform",
        # The closed port and the redirecting stub beside moto, on any port of loopback.
        DLAAS_ALLOWED_DATA_ENDPOINTS="127.0.0.1",
    ) as p:
        yield p


def connection(endpoint: str) -> dict[str, str]:
    return {"endpoint_url": endpoint, "access_key_id": USER_KEY, "secret_access_key": USER_SECRET}


def manifest(
    command: str,
    endpoint: str,
    data_bucket: str = "user-data",
    results_bucket: str | None = "user-results",
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "s3-training",
        "framework": {"name": "tensorflow", "version": "2.21", "command": command},
        "compute_configuration": {"name": "K80", "nodes": 1},
        "training_data_reference": {
            "type": "s3",
            "connection": connection(endpoint),
            "source": {"bucket": data_bucket, "prefix": "train"},
        },
    }
    if results_bucket:
        doc["training_results_reference"] = {
            "type": "s3",
            "connection": connection(endpoint),
            "target": {"bucket": results_bucket},
        }
    return doc


def secrets_in_processes() -> list[str]:
    """Every process whose command line or environment holds a user credential."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if USER_SECRET.encode() in blob or USER_KEY.encode() in blob:
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()!r}")
    return found


def test_data_in_from_a_user_bucket_results_out_to_both(live: LivePlatform, s3: S3Server) -> None:
    t = live.submit(manifest("python3 train.py 1.5", s3.url), CODE)
    tid = t["id"]
    running = live.wait_for(tid, {"RUNNING", "COMPLETED", "FAILED"}, timeout=60)
    assert running["status"] == "RUNNING", running
    # Credentials reach the learner through its private spec file only.
    spec = live.settings.work_dir / tid / "learner-1" / "spec.json"
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600
    assert secrets_in_processes() == []
    # With the entries that allow its endpoints, which the learner checks again.
    written = json.loads(spec.read_text())
    for name in ("training_data", "results_target"):
        assert written[name]["store"]["allowed_endpoints"] == [s3.url, "127.0.0.1"]
    done = live.wait_for(tid, {"COMPLETED", "FAILED"}, timeout=60)
    assert done["status"] == "COMPLETED", done
    # (DOWNLOADING and STORING may be too short for the monitor to see.)
    history = [e["status"] for e in done["status_history"]]
    assert history[:2] == ["QUEUED", "PENDING"] and history[-2:] in (
        ["RUNNING", "COMPLETED"],
        ["STORING", "COMPLETED"],
    )

    # The data reached DATA_DIR: everything below train/, nothing beside it.
    listing = live.client.get(
        f"/v1/trainings/{tid}/results/data-listing.txt", headers=live.headers
    ).text
    expected = [
        f"{key.removeprefix('train/')} {len(data)} {hashlib.sha256(data).hexdigest()}"
        for key, data in sorted(DATA.items())
        if key.startswith("train/") and not key.endswith("/")
    ]
    assert listing.splitlines() == expected

    # The platform's listing, from the platform's bucket (nothing under DLAAS_HOME/objects).
    r = live.client.get(f"/v1/trainings/{tid}/results", headers=live.headers)
    paths = {f["path"] for f in r.json()["files"]}
    assert {"data-listing.txt", "model/saved_model.pb", "learner-1/training-log.txt"} <= paths
    platform_objects = s3.objects("platform", f"trainings/{tid}/")
    assert f"trainings/{tid}/model_definition.zip" in platform_objects
    assert {p.removeprefix(f"trainings/{tid}/results/") for p in platform_objects} >= paths
    assert not (live.settings.home_dir / "objects").exists()

    # The user's bucket has the same files under training-<id>/ (WML's layout).
    user = s3.objects("user-results", f"training-{tid}/")
    assert set(user) == {f"training-{tid}/{p}" for p in paths}
    assert user[f"training-{tid}/model/saved_model.pb"] == b"model bytes"
    log = user[f"training-{tid}/learner-1/training-log.txt"].decode()
    assert "listed 2 files" in log

    # Credentials are nowhere a user or an operator reads.
    body = live.client.get(f"/v1/trainings/{tid}", headers=live.headers)
    assert body.json()["training_data_reference"]["connection"]["secret_access_key"] == "***"
    logs = live.logs(tid)
    for text in (body.text, logs, log, *_platform_logs(live)):
        assert USER_SECRET not in text and USER_KEY not in text

    # Deleting the training removes its files from the platform's bucket (the user's stay).
    assert live.client.delete(f"/v1/trainings/{tid}", headers=live.headers).status_code == 204
    assert s3.objects("platform", f"trainings/{tid}/") == {}
    assert s3.objects("user-results", f"training-{tid}/")


def _platform_logs(live: LivePlatform) -> list[str]:
    home = live.settings.home_dir
    return [p.read_text(errors="replace") for p in home.glob("*.log")]


def test_failing_user_stores_fail_the_training_naming_store_and_bucket(
    live: LivePlatform, s3: S3Server
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    cases = {
        "missing data bucket": (
            manifest("python3 train.py", s3.url, data_bucket="no-such-data"),
            [f"the S3 store at {s3.url} has no bucket 'no-such-data'"],
        ),
        "unreachable endpoint": (
            manifest("python3 train.py", closed, results_bucket=None),
            [f"the S3 store at {closed} (bucket 'user-data') is unreachable"],
        ),
        "missing results bucket": (
            manifest("python3 train.py", s3.url, results_bucket="no-such-results"),
            ["results bucket", f"the S3 store at {s3.url} has no bucket 'no-such-results'"],
        ),
    }
    started = time.monotonic()
    submitted = {name: live.submit(doc, CODE)["id"] for name, (doc, _) in cases.items()}
    for name, tid in submitted.items():
        done = live.wait_for(tid, {"COMPLETED", "FAILED"}, timeout=60)
        assert done["status"] == "FAILED", (name, done)
        for expected in cases[name][1]:
            assert expected in done["status_message"], (name, done["status_message"])
        # Nothing ran: the failure came while downloading, not after the training.
        assert "RUNNING" not in [e["status"] for e in done["status_history"]], name
        assert USER_SECRET not in json.dumps(done)
    assert time.monotonic() - started < 45


def test_a_redirect_to_the_metadata_address_fails_the_training_naming_the_endpoint(
    live: LivePlatform,
) -> None:
    """An endpoint that answers every request with a redirect (to the cloud metadata
    address, or to another server that would answer) is not followed: the training FAILS
    naming the endpoint, and nothing reaches the redirect's target."""
    metadata = "http://169.254.169.254/latest/meta-data/"
    with (
        stub_server() as target,
        stub_server(307, metadata) as to_metadata,
        stub_server(307, f"{target.url}/latest/meta-data/") as to_target,
    ):
        submitted = {
            stub.url: live.submit(manifest("python3 train.py", stub.url, results_bucket=None), CODE)
            for stub in (to_metadata, to_target)
        }
        for url, t in submitted.items():
            assert t["status"] == "QUEUED", t  # allowed at submission
            done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=60)
            assert done["status"] == "FAILED", done
            message = done["status_message"]
            assert f"the S3 store at {url} (bucket 'user-data') answered 307 redirecting" in (
                message
            ), message
            assert "the platform follows no redirects" in message
            assert "RUNNING" not in [e["status"] for e in done["status_history"]]
        assert to_metadata.requests and to_target.requests  # asked, and answered a redirect
        assert target.requests == []  # never followed


# -- the pieces: download progress in the status file and in the training -----------------


def learner_spec(
    tmp_path: Path, endpoint: str, allowed: tuple[str, ...] | None = None
) -> LearnerSpec:
    """A learner's spec whose training data is train/ of user-data at `endpoint`."""
    user = StoreConfig(
        kind="s3",
        endpoint=endpoint,
        access_key=Secret(USER_KEY),
        secret_key=Secret(USER_SECRET),
        bucket="user-data",
        allowed_endpoints=allowed,
    )
    return LearnerSpec(
        training_id="t1",
        learner_id=1,
        num_learners=1,
        hostname="learner-1",
        argv=["true"],
        env={},
        model_dir=str(tmp_path / "model"),
        data_dir=str(tmp_path / "data"),
        result_dir=str(tmp_path / "results"),
        log_dir=str(tmp_path / "logs"),
        checkpoint_dir=str(tmp_path / "ckpt"),
        model_definition_key="trainings/t1/model_definition.zip",
        store=StoreConfig(kind="local", root=str(tmp_path / "store")),
        log_sink=LogSinkConfig(kind="file", dir=str(tmp_path / "logsink")),
        results_prefix="trainings/t1/results/",
        training_data=BucketLocation(store=user, prefix="train/"),
    )


def test_download_progress_is_written_by_the_learner(s3: S3Server, tmp_path: Path) -> None:
    spec = learner_spec(tmp_path, s3.url)
    spec.write(tmp_path / "spec.json")
    assert USER_SECRET in (tmp_path / "spec.json").read_text()  # the one place it is
    assert USER_SECRET not in repr(spec)
    learner = Learner(
        LearnerSpec.read(tmp_path / "spec.json"),
        reporter=FileStatusReporter(tmp_path / "private" / "status.json", "t1"),
        rendezvous=FileRendezvous(None, (), 0),
        private_dir=tmp_path / "private",
    )
    learner.transfers.fetch_data(learner.downloading)
    status = json.loads((tmp_path / "private" / "status.json").read_text())
    assert status["phase"] == "DOWNLOADING"
    assert status["message"].startswith(
        f"downloaded the training data from the S3 store at {s3.url} (bucket 'user-data') "
        "under 'train/': 2 files, 300.0 KiB"
    )
    assert (tmp_path / "data" / "a.txt").read_bytes() == b"alpha"
    assert (tmp_path / "data" / "sub" / "b.bin").read_bytes() == DATA["train/sub/b.bin"]
    assert sorted(p.name for p in (tmp_path / "data").rglob("*")) == ["a.txt", "b.bin", "sub"]


def test_the_learner_checks_the_endpoint_again_and_connects_where_it_checked(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The learner resolves a user's endpoint itself: a name the operator lists is
    reached at the address it resolved to (here a name no DNS knows, at moto's address);
    a name allowed by a wildcard that now resolves to a private address is refused, naming
    the endpoint and the address."""
    port = int(s3.netloc.rsplit(":", 1)[1])
    dns = {"s3-pinned": "127.0.0.1", "data.example.com": "10.0.0.5"}
    monkeypatch.setattr(
        endpoints,
        "resolve_host",
        lambda host, port: [ipaddress.ip_address(dns[host])] if host in dns else [],
    )
    cases = {
        "s3-pinned": ("s3-pinned",),  # one label: moto takes the bucket from the path
        "data.example.com": ("*.example.com",),
    }
    for name, allowed in cases.items():
        spec = learner_spec(tmp_path / name, f"http://{name}:{port}", allowed)
        if name == "s3-pinned":
            Transfers(spec, tmp_path / name, tmp_path / name / "log.txt").fetch_data(print)
            assert (tmp_path / name / "data" / "a.txt").read_bytes() == b"alpha"
            continue
        with pytest.raises(PlatformError) as refused:
            Transfers(spec, tmp_path / name, tmp_path / name / "log.txt").fetch_data(print)
        assert str(refused.value) == (
            f"the S3 endpoint http://{name}:{port} is refused: the host '{name}' resolves "
            "to 10.0.0.5 (private); only endpoints the operator names may be private"
        )
        assert not (tmp_path / name / "data").exists()


def _downloading(message: str) -> Observation:
    """Its only learner downloading, with a given progress message."""
    return Observation(
        learners=(LearnerObservation(1, "DOWNLOADING", None, message),), primaries=(1,)
    )


def test_the_monitor_shows_download_progress_without_a_transition(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    tid = submit(client, tenant).json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, tid)
        assert training is not None
        record_transition(training, TrainingState.PENDING, "starting")
        record_transition(training, TrainingState.DOWNLOADING, None)
        session.commit()
    backend = Learners()
    backend.now = _downloading("downloading training data: 1 of 3 files")
    monitor = Monitor(platform, backend)
    monitor.tick()
    shown = client.get(f"/v1/trainings/{tid}", headers=tenant).json()
    assert shown["status"] == "DOWNLOADING"
    assert shown["status_message"] == "downloading training data: 1 of 3 files"
    backend.now = _downloading("downloading training data: 2 of 3 files")
    monitor.tick()
    shown = client.get(f"/v1/trainings/{tid}", headers=tenant).json()
    assert shown["status_message"] == "downloading training data: 2 of 3 files"
    assert [e["status"] for e in shown["status_history"]] == ["QUEUED", "PENDING", "DOWNLOADING"]
