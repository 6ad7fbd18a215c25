"""Where `dlaas up` runs learners: the backend of DLAAS_BACKEND, checked before the platform
says it is up, and the line of the start-up message that names it.

With DLAAS_BACKEND=kubernetes the control plane runs on this machine and the learners in a
cluster's pods. The pods reach what the platform hands them over the network only: the
object store (code, data, results) and the live log store. A store under DLAAS_HOME is a
directory of this machine that no pod can read, so `dlaas up` refuses to start with one
instead of failing every training at its first step. It also lists the namespace's pods
once (what the backend's watch starts with), so a wrong KUBECONFIG, an unreachable API
server or a namespace the credentials may not read is said at start, not at the first
training. Without a role to assume for the learners' store credentials it refuses too
(worker.backends.kubernetes.credentials), unless the operator accepts unscoped ones.
"""

from __future__ import annotations

import os

from composition.errors import EmbeddedError
from service.settings import Settings
from worker.backends import make_backend
from worker.backends.base import Backend

# How long the first list of the namespace's pods may take before `dlaas up` gives up.
CLUSTER_CHECK_SECONDS = 10.0


def kubernetes_store_problems(settings: Settings) -> list[str]:
    """What keeps the learners' pods from reaching the platform's stores (empty: nothing)."""
    problems = []
    if not settings.s3_endpoint:
        problems.append(
            "the object store is a directory of this machine: set DLAAS_S3_ENDPOINT (and "
            "DLAAS_S3_ACCESS_KEY, DLAAS_S3_SECRET_KEY, DLAAS_S3_BUCKET) to an S3 endpoint "
            "that both this machine and the pods reach"
        )
    if settings.resolved_log_store_url is None:
        problems.append(
            "the live logs are files of this machine: set DLAAS_LOG_STORE_URL (or a "
            "redis:// DLAAS_BROKER_URL) to a Redis that both this machine and the pods reach"
        )
    return problems


def kubernetes_network_problems(settings: Settings) -> list[str]:
    """What keeps each training's NetworkPolicy from letting its pods reach the stores: with
    DLAAS_K8S_NETWORK_POLICY, an egress that names nothing (empty: nothing)."""
    rules = settings.k8s_egress_rules
    if not settings.k8s_network_policy or rules.cidrs or rules.pods:
        return []
    return [
        "each training's NetworkPolicy lets its pods reach only each other and DNS: set "
        "DLAAS_K8S_EGRESS_CIDRS (or DLAAS_K8S_EGRESS_PODS) to where the pods reach "
        "DLAAS_S3_ENDPOINT and the log store's Redis, or DLAAS_K8S_NETWORK_POLICY=false on "
        "a cluster whose network plugin enforces no NetworkPolicy"
    ]


def open_backend(settings: Settings) -> Backend:
    """The backend of DLAAS_BACKEND, ready to run learners; EmbeddedError saying why not."""
    if settings.backend != "kubernetes":
        return make_backend(settings)
    problems = kubernetes_store_problems(settings) + kubernetes_network_problems(settings)
    if problems:
        raise EmbeddedError(
            "DLAAS_BACKEND=kubernetes runs learners in pods, which reach the platform's "
            "stores only over the network: " + "; ".join(problems)
        )
    from kubernetes.config import ConfigException

    from worker.backends.kubernetes.backend import KubernetesBackend
    from worker.backends.kubernetes.credentials import StoreCredentialsRefused

    try:
        backend = KubernetesBackend.from_settings(settings)
    except StoreCredentialsRefused as e:
        raise EmbeddedError(f"DLAAS_BACKEND=kubernetes: {e}") from e
    except (ConfigException, OSError) as e:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise EmbeddedError(f"no Kubernetes cluster configured ({where}): {e}") from e
    try:
        backend.watch.ensure_started(timeout=CLUSTER_CHECK_SECONDS)
    except RuntimeError as e:
        backend.close()
        raise EmbeddedError(
            f"the Kubernetes API at {backend.api.configuration.host} did not answer: {e} "
            "(check KUBECONFIG, and that its credentials may list pods in "
            f"DLAAS_K8S_NAMESPACE={settings.k8s_namespace})"
        ) from e
    return backend


def close_backend(backend: Backend) -> None:
    """Release what the backend holds (the Kubernetes backend's watch); the Backend
    protocol has no close, the local backend holds nothing to release."""
    close = getattr(backend, "close", None)
    if callable(close):
        close()


def describe_backend(settings: Settings, backend: Backend) -> str:
    """Where learners run, for the start-up message."""
    if settings.backend != "kubernetes":
        return f"{settings.backend} (learners are processes of this machine)"
    api = getattr(backend, "api", None)
    host = api.configuration.host if api is not None else "?"
    return f"kubernetes, namespace {settings.k8s_namespace} (API server {host})"
