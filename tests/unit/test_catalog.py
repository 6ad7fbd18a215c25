from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.domain.catalog import (
    DEFAULT_CATALOG,
    GPU_PRODUCT_LABEL,
    GPU_TOLERATION,
    ComputeSpec,
    Toleration,
)
from service.domain.manifest import load_manifest
from service.errors import ValidationFailed
from service.platform import load_catalog
from tests.manifest_cases import base


def test_default_catalog_matches_the_seeds() -> None:
    seeds = {"tensorflow", "tensorflow-ddl", "tensorflow-horovod"}
    # The seeds' frameworks, and PyTorch's (issue 29).
    assert set(DEFAULT_CATALOG.frameworks) == seeds | {"pytorch", "pytorch-ddl"}
    assert all("1.5" in DEFAULT_CATALOG.frameworks[f].versions for f in seeds)
    assert {"K80", "P100", "V100"} <= set(DEFAULT_CATALOG.compute_configurations)
    distributed = {
        n for n, c in DEFAULT_CATALOG.compute_configurations.items() if c.supports_distributed
    }
    assert "P100" in distributed and "K80" not in distributed
    assert not DEFAULT_CATALOG.plans["lite"].distributed
    assert DEFAULT_CATALOG.plans["lite"].max_concurrent_trainings == 1
    assert DEFAULT_CATALOG.plans["standard"].distributed


def test_operator_file_replaces_sections(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(
        "compute_configurations:\n"
        "  CPU: {gpus: 0, cpus: 2, memory_gib: 4, supports_distributed: true}\n"
        "plans:\n"
        "  team: {distributed: true, max_nodes: 2, max_concurrent_trainings: 3,"
        " predictions_per_minute: 100}\n"
    )
    catalog = load_catalog(path)
    assert set(catalog.compute_configurations) == {"CPU"}
    assert catalog.frameworks == DEFAULT_CATALOG.frameworks  # untouched section kept
    ok = base(compute_configuration={"name": "CPU", "nodes": 2})
    assert load_manifest(ok, catalog, "team").nodes == 2
    with pytest.raises(ValidationFailed) as info:
        load_manifest(base(compute_configuration={"name": "CPU", "nodes": 3}), catalog, "team")
    assert "at most 2 nodes" in info.value.detail


@pytest.mark.parametrize(
    "text",
    ["plans: {x: {distributed: maybe}}\n", "colours: {}\n", "- a list\n"],
)
def test_bad_operator_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    with pytest.raises((ValueError, ValidationError)):
        load_catalog(path)


def test_gpu_configurations_place_learners_on_their_gpu_product() -> None:
    for name, compute in DEFAULT_CATALOG.compute_configurations.items():
        product = compute.node_selector[GPU_PRODUCT_LABEL]
        assert product.startswith("Tesla-" + name.removesuffix("x2")), name
        assert compute.tolerations == (GPU_TOLERATION,)
    p100 = DEFAULT_CATALOG.compute_configurations["P100"]
    assert p100.node_selector == {"nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB"}


def test_operator_file_sets_node_labels_and_tolerations(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(
        "compute_configurations:\n"
        "  P100:\n"
        "    gpus: 1\n"
        "    cpus: 8\n"
        "    memory_gib: 24\n"
        "    node_selector: {cloud.example.com/accelerator: nvidia-tesla-p100, pool: gpu}\n"
        "    tolerations:\n"
        "      - {key: pool, operator: Equal, value: gpu, effect: NoExecute,"
        " toleration_seconds: 30}\n"
        "      - {operator: Exists}\n"
        "  CPU: {gpus: 0, cpus: 2, memory_gib: 4}\n"
    )
    catalog = load_catalog(path)
    p100 = catalog.compute_configurations["P100"]
    assert p100.node_selector == {
        "cloud.example.com/accelerator": "nvidia-tesla-p100",
        "pool": "gpu",
    }
    assert p100.tolerations == (
        Toleration(key="pool", value="gpu", effect="NoExecute", toleration_seconds=30),
        Toleration(operator="Exists"),
    )
    cpu = catalog.compute_configurations["CPU"]
    assert cpu.node_selector == {} and cpu.tolerations == ()


@pytest.mark.parametrize(
    ("compute", "message"),
    [
        ({"node_selector": {"bad key!": "x"}}, "not a valid label key"),
        ({"node_selector": {"example.com/": "x"}}, "not a valid label key"),
        ({"node_selector": {"-pool": "x"}}, "not a valid label key"),
        ({"node_selector": {"pool": "not ok"}}, "not a valid label value"),
        ({"node_selector": {"pool": "x" * 64}}, "not a valid label value"),
        ({"tolerations": [{"value": "x"}]}, "without a key must use the operator Exists"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}, "takes no value"),
        ({"tolerations": [{"key": "a", "toleration_seconds": 5}]}, "NoExecute only"),
        ({"tolerations": [{"key": "a", "effect": "Sometimes"}]}, "effect"),
        ({"tolerations": [{"key": "a", "tolerationSeconds": 5}]}, "Extra inputs"),
    ],
)
def test_node_labels_and_tolerations_are_checked(compute: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ComputeSpec.model_validate({"gpus": 1, "cpus": 1, "memory_gib": 1, **compute})
