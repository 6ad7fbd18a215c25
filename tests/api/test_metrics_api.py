"""GET /v1/trainings/{id}/metrics for metric regexes: the documents learners stored as their
output was written (keys.log_metrics_key), read from the platform's store, local or S3,
never the log."""

from __future__ import annotations

import io
import json

import pytest
from fastapi.testclient import TestClient

from service.domain.metrics import LogMetricExtractor
from service.logs.base import LogRecord
from service.platform import Platform
from service.settings import Settings
from service.storage import keys
from tests.conftest import manifest_yaml, submit

LOSS = {"name": "loss", "regex": r"loss=([0-9.]+)"}
ACC = {"name": "acc", "regex": r"acc=([0-9.]+)"}
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.fixture
def settings(settings_on_each_store: Settings) -> Settings:
    return settings_on_each_store


def store_learner_metrics(
    platform: Platform, training_id: str, learner: int, lines: list[tuple[float, str]]
) -> None:
    """What learner `learner`'s wrapper stores after writing `lines` of output."""
    extractor = LogMetricExtractor([(LOSS["name"], LOSS["regex"]), (ACC["name"], ACC["regex"])])
    for ts, line in lines:
        extractor.feed(ts, line)
    data = json.dumps(extractor.document(learner)).encode()
    key = keys.log_metrics_key(training_id, learner)
    platform.store.put_stream(key, io.BytesIO(data), len(data))


def test_metrics_are_every_learners_stored_points_merged_in_time_order(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    manifest = manifest_yaml(
        compute_configuration={"name": "P100", "nodes": 2}, evaluation_metrics=[LOSS, ACC]
    )
    r = submit(client, tenant, manifest)
    assert r.status_code == 201, r.text
    training_id = r.json()["id"]
    url = f"/v1/trainings/{training_id}/metrics"
    # No learner has stored any yet: every metric is named, with no points.
    r = client.get(url, headers=tenant)
    assert r.status_code == 200, r.text
    assert r.json() == {"loss": [], "acc": []}

    store_learner_metrics(
        platform, training_id, 1, [(T0, "step 1 loss=0.5"), (T0 + 2, "step 2 loss=0.25 acc=0.9")]
    )
    store_learner_metrics(platform, training_id, 2, [(T0 + 1, "step 1 loss=0.75")])
    r = client.get(url, headers=tenant)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "loss": [
            {"value": 0.5, "learner": 1, "timestamp": "2023-11-14T22:13:20.000Z", "step": 1},
            {"value": 0.75, "learner": 2, "timestamp": "2023-11-14T22:13:21.000Z", "step": 1},
            {"value": 0.25, "learner": 1, "timestamp": "2023-11-14T22:13:22.000Z", "step": 2},
        ],
        "acc": [
            {"value": 0.9, "learner": 1, "timestamp": "2023-11-14T22:13:22.000Z", "step": 2},
        ],
    }

    # A document that is not one a learner writes is a 409 naming the learner, not a 500.
    bad = b'{"format": 1, "metrics": {"loss": [[1, 2]]}}'
    platform.store.put_stream(keys.log_metrics_key(training_id, 2), io.BytesIO(bad), len(bad))
    r = client.get(url, headers=tenant)
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == ["learner-2"]


def test_the_log_is_not_read_a_training_without_documents_has_no_points(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    """A training whose learners ran before they stored their metrics: its log holds
    matching lines, but the answer is every metric with no points, not a scan."""
    r = submit(client, tenant, manifest_yaml(evaluation_metrics=[LOSS]))
    assert r.status_code == 201, r.text
    training_id = r.json()["id"]
    platform.logs.append(training_id, [LogRecord(1, T0 + i, f"loss={i}") for i in range(50)])
    r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
    assert r.status_code == 200, r.text
    assert r.json() == {"loss": []}


def test_another_tenants_training_is_not_found(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    from tests.conftest import create_tenant

    r = submit(client, tenant, manifest_yaml(evaluation_metrics=[LOSS]))
    training_id = r.json()["id"]
    store_learner_metrics(platform, training_id, 1, [(T0, "loss=1")])
    other = create_tenant(client, "other")
    r = client.get(f"/v1/trainings/{training_id}/metrics", headers=other)
    assert r.status_code == 404, r.text


def test_a_dashboard_polling_metrics_costs_no_orm_session(
    client: TestClient, tenant: dict[str, str], platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route a dashboard polls (and a noisy tenant floods) reads the training with
    prepared Core queries on the event loop, no ORM session and no dependency solving."""
    r = submit(client, tenant, manifest_yaml(evaluation_metrics=[LOSS]))
    training_id = r.json()["id"]
    store_learner_metrics(platform, training_id, 1, [(T0, "loss=1")])

    def no_session() -> None:
        raise AssertionError("GET .../metrics opened an ORM session")

    monkeypatch.setattr(platform, "sessions", no_session)
    r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
    assert r.status_code == 200, r.text
    assert [p["value"] for p in r.json()["loss"]] == [1.0]
    r = client.get("/v1/trainings/nosuchtraining/metrics", headers=tenant)
    assert r.status_code == 404, r.text


def test_a_stored_regex_re2_refuses_is_a_conflict_naming_it(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    """A training submitted before metric regexes ran on RE2 may keep one RE2 refuses (a
    backreference): 409, naming the regex's place in the manifest."""
    from service.db.models import Training

    r = submit(client, tenant, manifest_yaml(evaluation_metrics=[LOSS, ACC]))
    training_id = r.json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        manifest = dict(training.manifest)
        manifest["evaluation_metrics"] = [LOSS, {"name": "acc", "regex": r"(a)\1=([0-9.]+)"}]
        training.manifest = manifest
        session.commit()
    for _ in range(2):  # the refusal is kept, and said again
        r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
        assert r.status_code == 409, r.text
        assert [e["field"] for e in r.json()["errors"]] == ["/evaluation_metrics/1/regex"]
