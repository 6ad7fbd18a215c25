from __future__ import annotations

from typing import Any

import pytest

from service.domain.catalog import DEFAULT_CATALOG
from service.domain.manifest import load_manifest, parse_manifest_text
from service.errors import BadRequest, ValidationFailed
from tests.manifest_cases import ACCEPTED, REJECTED, Case, seed


@pytest.mark.parametrize("case", REJECTED, ids=lambda c: c.id)
def test_rejected(case: Case) -> None:
    with pytest.raises(ValidationFailed) as info:
        load_manifest(case.manifest, DEFAULT_CATALOG, case.plan)
    named = {e.field: e.message for e in info.value.errors}
    assert case.field in named, named
    assert case.words in named[case.field]


@pytest.mark.parametrize(("name", "manifest", "plan"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_accepted(name: str, manifest: dict[str, Any], plan: str) -> None:
    load_manifest(manifest, DEFAULT_CATALOG, plan)


def test_seed_keys_fold_into_the_canonical_form() -> None:
    m = load_manifest(seed(), DEFAULT_CATALOG, "standard")
    assert (m.framework.name, m.framework.version, m.framework.command) == (
        "tensorflow",
        "1.5",
        "python3 launcher.py",
    )
    assert (m.compute_configuration.name, m.nodes, m.parameter_servers) == ("P100", 2, 1)


def test_parameter_servers_apply_to_distributed_tensorflow_only() -> None:
    single = load_manifest(
        {
            "name": "x",
            "framework": {"name": "tensorflow", "version": "1.5", "command": "c"},
            "compute_configuration": {"name": "K80"},
        },
        DEFAULT_CATALOG,
        "lite",
    )
    assert single.nodes == 1 and single.parameter_servers == 0


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: [unclosed", "not valid YAML or JSON"),
        ('{"name": ', "not valid YAML or JSON"),
        ("- just\n- a list\n", "must be a YAML or JSON mapping"),
        ("plain words", "must be a YAML or JSON mapping"),
        (b"\xff\xfe\x00", "not UTF-8"),
        ("a: &x [1]\nb: *x\n", "aliases are not allowed"),
        ("x: " + "y" * 70_000, "larger than"),
    ],
)
def test_unreadable_manifest_names_the_manifest_field(text: str | bytes, words: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_manifest_text(text)
    assert info.value.status == 400
    assert info.value.errors[0].field == "manifest"
    assert words in info.value.detail


def test_json_and_yaml_give_the_same_manifest() -> None:
    as_json = parse_manifest_text('{"name": "a", "framework": {"version": "1.5"}}')
    as_yaml = parse_manifest_text("name: a\nframework:\n  version: '1.5'\n")
    assert as_json == as_yaml
