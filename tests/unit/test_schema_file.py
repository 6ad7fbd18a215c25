"""manifests/manifest.schema.json is generated from the model; this keeps it in sync, and
checks every example manifest is valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.domain.catalog import DEFAULT_CATALOG
from service.domain.manifest import load_manifest, manifest_json_schema, parse_manifest_text

MANIFESTS = Path(__file__).parents[2] / "manifests"


def test_schema_file_is_in_sync() -> None:
    on_disk = json.loads((MANIFESTS / "manifest.schema.json").read_text())
    assert on_disk == manifest_json_schema(), (
        "regenerate it: python -m service.domain.manifest > manifests/manifest.schema.json"
    )


EXAMPLES = sorted(MANIFESTS.glob("[0-9]*.yaml"))


def test_there_is_an_example_per_framework() -> None:
    frameworks = {
        load_manifest(
            parse_manifest_text(p.read_text()), DEFAULT_CATALOG, "standard"
        ).framework.name
        for p in EXAMPLES
    }
    assert frameworks == set(DEFAULT_CATALOG.frameworks)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_and_say_how_to_submit(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#") and "curl" in text and "/v1/trainings" in text
    load_manifest(parse_manifest_text(text), DEFAULT_CATALOG, "standard")
