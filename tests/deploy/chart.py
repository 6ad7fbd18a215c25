"""The chart helm/dlaas rendered offline (helm-python-sdk: Helm's own Go SDK, no cluster,
no helm binary) into the Kubernetes objects an install would create."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "dlaas"
RELEASE = "demo"
NAMESPACE = "ml-platform"

# An install against services that already exist, as the README shows it.
EXTERNAL_VALUES: dict[str, Any] = {
    "postgresql": {
        "bundled": False,
        "url": "postgresql+psycopg://dlaas:pw@db.example.com:5432/dlaas",
    },
    "redis": {"bundled": False, "url": "redis://:pw@redis.example.com:6379/0"},
    "s3": {
        "bundled": False,
        "endpoint": "https://s3.us-east-1.amazonaws.com",
        "accessKey": "AKIAEXAMPLE",
        "secretKey": "secret-example",
        "bucket": "acme-dlaas",
        "region": "us-east-1",
        "roleArn": "arn:aws:iam::123456789012:role/dlaas-learners",
        "sessionMaxSeconds": 3600,
    },
    "secrets": {"adminApiKey": "admin-example", "secretKey": "sealing-example"},
    "scoring": {"enabled": True},
    "api": {"ingress": {"enabled": True, "host": "dlaas.acme.test", "tlsSecretName": "tls"}},
    "image": {"prefix": "registry.acme.test/dlaas/", "tag": "1.2.3"},
    "imagePullSecrets": ["regcred"],
}


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm install` would render them."""
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt is not one)."""
    found: list[dict[str, Any]] = []
    for path, text in sorted(render(values).items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}
