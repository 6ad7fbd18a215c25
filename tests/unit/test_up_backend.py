"""What `dlaas up` asks of its stores before it runs learners in a cluster's pods: each one
reachable over the network (composition.backend), or a message naming the setting."""

from __future__ import annotations

import logging
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


# -- the learners' store credentials: a role to assume, or the operator's explicit consent --

REACHABLE = {
    **S3,
    "log_store_url": "redis://10.0.0.5:6379/0",
    # Each training's NetworkPolicy lets its pods reach the stores.
    "k8s_egress_cidrs": "10.0.0.0/24",
}


def test_without_a_role_the_kubernetes_backend_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before it reads any kubeconfig: the refusal names both settings."""
    from composition.backend import open_backend
    from composition.errors import EmbeddedError
    from worker.backends.kubernetes.backend import KubernetesBackend
    from worker.backends.kubernetes.credentials import StoreCredentialsRefused

    for name in [n for n in os.environ if n.startswith("DLAAS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    settings = Settings(home=tmp_path, backend="kubernetes", **REACHABLE)
    with pytest.raises(StoreCredentialsRefused) as refused:
        KubernetesBackend.from_settings(settings)
    assert "DLAAS_STORE_ROLE_ARN is not set" in str(refused.value)
    assert "DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true" in str(refused.value)
    with pytest.raises(EmbeddedError, match="DLAAS_STORE_ROLE_ARN is not set"):
        open_backend(settings)


@pytest.mark.parametrize(
    ("values", "warned"),
    [
        ({"store_role_arn": "arn:aws:iam::123456789012:role/learners"}, False),
        ({"k8s_allow_platform_store_credentials": True}, True),
        (
            {
                "store_role_arn": "arn:aws:iam::123456789012:role/learners",
                "k8s_allow_platform_store_credentials": True,
            },
            False,
        ),
    ],
)
def test_a_role_or_the_explicit_setting_lets_it_start(
    tmp_path: Path,
    values: dict[str, Any],
    warned: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.backends.kubernetes.credentials import (
        check_store_credentials,
        store_credentials_problem,
    )

    for name in [n for n in os.environ if n.startswith("DLAAS_")]:
        monkeypatch.delenv(name)
    settings = Settings(home=tmp_path, backend="kubernetes", **REACHABLE, **values)
    assert store_credentials_problem(settings) is None
    with caplog.at_level(logging.WARNING, logger="worker.backends.kubernetes.credentials"):
        check_store_credentials(settings)
    said = [r.getMessage() for r in caplog.records]
    assert said == (
        [
            "DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true and no DLAAS_STORE_ROLE_ARN: "
            "learner pods get the platform's own store credentials, not scoped to their "
            "training"
        ]
        if warned
        else []
    )
