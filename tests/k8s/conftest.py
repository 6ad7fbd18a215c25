"""The Kubernetes API for the backend's tests: an emulator on localhost (tests/k8s_emulator.py)
and the official client configured for it from a kubeconfig file, as `KUBECONFIG` would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.k8s_emulator import RunningApiserver, running_apiserver

NAMESPACE = "dlaas"


@pytest.fixture
def k8s_apiserver(tmp_path: Path) -> Iterator[RunningApiserver]:
    """A fresh emulated API server for one test; its kubeconfig is `.kubeconfig`."""
    with running_apiserver(tmp_path) as apiserver:
        yield apiserver


@pytest.fixture
def k8s_api(k8s_apiserver: RunningApiserver) -> Iterator[client.ApiClient]:
    """The official client, configured from the emulator's kubeconfig file."""
    api = config.new_client_from_config(config_file=str(k8s_apiserver.kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def core(k8s_api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_api)
