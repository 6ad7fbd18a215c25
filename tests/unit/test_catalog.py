from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.domain.catalog import DEFAULT_CATALOG
from service.domain.manifest import load_manifest
from service.errors import ValidationFailed
from service.platform import load_catalog
from tests.manifest_cases import base


def test_default_catalog_matches_the_seeds() -> None:
    assert set(DEFAULT_CATALOG.frameworks) == {"tensorflow", "tensorflow-ddl", "tensorflow-horovod"}
    assert all("1.5" in f.versions for f in DEFAULT_CATALOG.frameworks.values())
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
