from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from service.domain.catalog import DEFAULT_CATALOG, Catalog
from service.domain.manifest import Manifest, check_rules, load_manifest, parse_manifest_text
from service.errors import BadRequest, ValidationFailed
from tests.manifest_cases import ACCEPTED, REJECTED, Case, base, seed

# 9^9 nodes once its aliases are expanded, in a few hundred bytes.
BILLION_LAUGHS = "\n".join(
    ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
)


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
    assert (m.compute_configuration.name, m.nodes) == ("P100", 2)
    assert m.parameter_servers_in(DEFAULT_CATALOG) == 1


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
    assert single.nodes == 1 and single.parameter_servers_in(DEFAULT_CATALOG) == 0


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: [unclosed", "not valid YAML or JSON"),
        ('{"name": ', "not valid YAML or JSON"),
        ("- just\n- a list\n", "must be a YAML or JSON mapping"),
        ("plain words", "must be a YAML or JSON mapping"),
        (b"\xff\xfe\x00", "not UTF-8"),
        # an alias bomb ("billion laughs"): 9^9 nodes once expanded, refused unexpanded
        (BILLION_LAUGHS, "expands to more than 10000 YAML nodes"),
        ("a: &x [1, 2]\nb: [" + ", ".join(["*x"] * 5000) + "]\n", "more than 10000"),
        ("x: " + "[" * 65 + "]" * 65, "nests deeper than 64 levels"),
        ("x: " + "[" * 20_000 + "]" * 20_000, "nests deeper than 64 levels"),
        ('{"x": ' + "[" * 30_000 + "]" * 30_000 + "}", "nests deeper than 64 levels"),
        # depth reached only through aliases
        ("a: &x " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*x" + "]" * 30, "expanded"),
        ("a: &x [1, *x]\n", "refers to a node containing it"),
        ("x: " + "y" * 70_000, "larger than"),
    ],
)
def test_unreadable_manifest_names_the_manifest_field(text: str | bytes, words: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_manifest_text(text)
    assert info.value.status == 400
    assert info.value.errors[0].field == "manifest"
    assert words in info.value.detail


def test_an_alias_bomb_is_refused_without_being_expanded() -> None:
    started = time.monotonic()
    with pytest.raises(BadRequest):
        parse_manifest_text(BILLION_LAUGHS)
    assert time.monotonic() - started < 1.0


def test_anchors_and_aliases_are_accepted() -> None:
    # As PyYAML writes one dict used twice: `&id001` / `*id001`.
    connection = {"endpoint_url": "http://s3", "access_key_id": "a", "secret_access_key": "b"}
    text = yaml.safe_dump(
        {
            "name": "x",
            "training_data_reference": {"connection": connection},
            "training_results_reference": {"connection": connection},
        }
    )
    assert "&id001" in text and "*id001" in text
    data = parse_manifest_text(text)
    data_conn = data["training_data_reference"]["connection"]
    results_conn = data["training_results_reference"]["connection"]
    assert data_conn == results_conn == connection
    assert data_conn is not results_conn  # each place its own object
    # Merge keys too, and a document right at the limits.
    merged = parse_manifest_text("base: &b {a: 1}\nderived: {<<: *b, c: 2}\n")
    assert merged["derived"] == {"a": 1, "c": 2}
    parse_manifest_text("x: " + "[" * 63 + "]" * 63)


def test_json_and_yaml_give_the_same_manifest() -> None:
    as_json = parse_manifest_text('{"name": "a", "framework": {"version": "1.5"}}')
    as_yaml = parse_manifest_text("name: a\nframework:\n  version: '1.5'\n")
    assert as_json == as_yaml


_METRICS = [
    {"name": "loss", "regex": r"loss=(\S+)"},
    {"name": "loss", "regex": r"loss=(\S+"},
    {"name": "acc", "regex": r"(a)=(\S+)"},
]
_NO_DISTRIBUTED_COMPUTE = DEFAULT_CATALOG.with_overrides(
    {"compute_configurations": {"CPU": {"gpus": 0, "cpus": 2, "memory_gib": 4}}}
)


@pytest.mark.parametrize(
    ("manifest", "plan", "catalog", "errors"),
    [
        (
            base(
                framework={"name": "caffe", "command": " ", "parameter_servers": 1},
                compute_configuration={"name": "Z80", "nodes": 3},
                evaluation_metrics=_METRICS,
            ),
            "lite",
            DEFAULT_CATALOG,
            [
                (
                    "/framework/name",
                    "unknown framework 'caffe'; supported: pytorch, pytorch-ddl, "
                    "tensorflow, tensorflow-ddl, tensorflow-horovod",
                ),
                ("/framework/command", "must not be empty"),
                (
                    "/compute_configuration/name",
                    "unknown compute configuration 'Z80'; "
                    "supported: K80, K80x2, P100, P100x2, V100, V100x2",
                ),
                (
                    "/framework/parameter_servers",
                    "applies only to tensorflow trainings with nodes > 1",
                ),
                ("/evaluation_metrics/1/name", "is given twice"),
                (
                    "/evaluation_metrics/1/regex",
                    "does not compile: missing ): loss=(\\S+ (metric regexes run on RE2, "
                    "which has no backreferences or lookaround)",
                ),
                (
                    "/evaluation_metrics/2/regex",
                    "must have exactly one capturing group (the value); it has 2",
                ),
                (
                    "/compute_configuration/nodes",
                    "the lite plan does not support distributed training",
                ),
            ],
        ),
        (
            base(
                framework={"name": "tensorflow-horovod", "version": "9.9", "parameter_servers": 1},
                compute_configuration={"name": "K80", "nodes": 1},
            ),
            "lite",
            DEFAULT_CATALOG,
            [
                (
                    "/framework/version",
                    "tensorflow-horovod version '9.9' is not supported; "
                    "supported versions: 1.5, 2.21",
                ),
                (
                    "/compute_configuration/nodes",
                    "tensorflow-horovod is distributed: nodes must be > 1",
                ),
                (
                    "/compute_configuration/name",
                    "K80 does not support distributed training; use one of: P100, P100x2",
                ),
                (
                    "/framework/parameter_servers",
                    "applies only to tensorflow trainings with nodes > 1",
                ),
                ("/framework/name", "the lite plan does not support distributed training"),
            ],
        ),
        (
            base(compute_configuration={"nodes": 3}, framework={"parameter_servers": 3}),
            "gold",
            DEFAULT_CATALOG,
            [
                (
                    "/framework/parameter_servers",
                    "must be less than nodes (3) so at least one learner is a worker",
                ),
                ("/compute_configuration", "plan 'gold' is not offered"),
            ],
        ),
        (
            base(compute_configuration={"nodes": 20}),
            "standard",
            DEFAULT_CATALOG,
            [("/compute_configuration/nodes", "the standard plan allows at most 16 nodes")],
        ),
        (
            base(compute_configuration={"name": "CPU", "nodes": 2}),
            "standard",
            _NO_DISTRIBUTED_COMPUTE,
            [
                (
                    "/compute_configuration/name",
                    "CPU does not support distributed training; use one of: none in this catalog",
                )
            ],
        ),
        (base(compute_configuration={"nodes": 2}), "standard", DEFAULT_CATALOG, []),
    ],
    ids=["every-group", "horovod-single-node", "ps-and-plan", "max-nodes", "no-distributed", "ok"],
)
def test_check_rules_reports_every_group_in_order(
    manifest: dict[str, Any], plan: str, catalog: Catalog, errors: list[tuple[str, str]]
) -> None:
    found = check_rules(Manifest.model_validate(manifest), catalog, plan)
    assert [(e.field, e.message) for e in found] == errors
