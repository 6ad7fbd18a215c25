"""What `dlaas up` asks of its stores before it runs learners in a cluster's pods: each one
reachable over the network (composition.backend), or a message naming the setting."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from composition.backend import kubernetes_store_problems
from service.settings import Settings

S3 = {"s3_endpoint": "http://10.0.0.5:9000", "s3_access_key": "k", "s3_secret_key": "s"}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({}, ["DLAAS_S3_ENDPOINT", "DLAAS_LOG_STORE_URL"]),
        (S3, ["DLAAS_LOG_STORE_URL"]),
        ({"log_store_url": "redis://10.0.0.5:6379/0"}, ["DLAAS_S3_ENDPOINT"]),
        ({**S3, "log_store_url": "redis://10.0.0.5:6379/0"}, []),
        ({**S3, "broker_url": "redis://10.0.0.5:6379/0"}, []),  # the logs go to the broker
        ({**S3, "broker_url": "dlaas-filesystem://"}, ["DLAAS_LOG_STORE_URL"]),
    ],
)
def test_stores_the_pods_cannot_reach_are_named(
    tmp_path: Path, values: dict[str, Any], named: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("DLAAS_")]:
        monkeypatch.delenv(name)
    settings = Settings(home=tmp_path, backend="kubernetes", **values)
    problems = kubernetes_store_problems(settings)
    assert len(problems) == len(named)
    for problem, setting in zip(problems, named, strict=True):
        assert setting in problem
