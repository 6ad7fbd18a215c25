"""The cases of the real-cluster suite, checked without a cluster: every numbered example
manifest names existing code, and the CPU catalog makes each schedulable anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.domain.catalog import DEFAULT_CATALOG
from service.domain.manifest import load_manifest
from tests.k8s_cluster.examples import Example, cpu_catalog, example_code, numbered_examples


def test_every_numbered_manifest_names_its_example_code() -> None:
    examples = numbered_examples()
    assert [e.name for e in examples][:1] == ["01-tensorflow-single"]
    assert len(examples) >= 6
    for example in examples:
        assert example.code.is_dir(), example
        assert any(example.code.iterdir()), example


def test_the_header_line_is_read_and_its_absence_refused(tmp_path: Path) -> None:
    assert example_code("# a\n# Example code: examples/hello (x)\nname: n\n") == "examples/hello"
    assert example_code("name: n\n") is None
    (tmp_path / "01-x.yaml").write_text("name: x\n")
    with pytest.raises(ValueError, match=r"01-x\.yaml"):
        numbered_examples(tmp_path)


@pytest.mark.parametrize("example", numbered_examples(), ids=lambda e: e.name)
def test_each_example_is_accepted_on_the_cpu_catalog(example: Example) -> None:
    catalog = DEFAULT_CATALOG.with_overrides(cpu_catalog())
    for spec in catalog.compute_configurations.values():
        assert spec.gpus == 0 and not spec.node_selector and not spec.tolerations
    manifest = yaml.safe_load(example.manifest.read_text())
    load_manifest(manifest, catalog, "standard")  # the `local` tenant's plan
