"""How many learners serve parameters: one rule (service.domain.manifest), asked by the
manifest and by the worker reading a stored manifest back, keyed on the catalog's
distribution of the framework."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from service.db.models import Training
from service.domain.catalog import DEFAULT_CATALOG, Catalog
from service.domain.manifest import (
    Manifest,
    load_manifest,
    parameter_server_count,
    takes_parameter_servers,
)
from service.errors import ValidationFailed
from service.platform import Platform
from tests.manifest_cases import base
from worker.execution import training_spec


@pytest.mark.parametrize(
    ("distribution", "nodes", "requested", "count"),
    [
        ("parameter_server", 1, None, 0),
        ("parameter_server", 2, None, 1),
        ("parameter_server", 3, None, 1),
        ("parameter_server", 3, 2, 2),
        ("parameter_server", 2, 0, 0),
        ("mpi", 1, None, 0),
        ("mpi", 4, None, 0),
        ("mpi", 4, 1, 0),  # refused by the manifest rules; never counted
        (None, 3, None, 0),  # not in the catalog
        (None, 3, 1, 0),
    ],
)
def test_parameter_server_count(
    distribution: str | None, nodes: int, requested: int | None, count: int
) -> None:
    assert parameter_server_count(distribution, nodes, requested) == count
    assert takes_parameter_servers(distribution, nodes) == (
        distribution == "parameter_server" and nodes > 1
    )


# The default catalog: tensorflow with nodes > 1 only, default 1.
DEFAULT_CASES = [
    ("tensorflow", 1, None, 0),
    ("tensorflow", 2, None, 1),
    ("tensorflow", 4, None, 1),
    ("tensorflow", 3, 2, 2),
    ("tensorflow", 3, 0, 0),
    ("tensorflow-horovod", 2, None, 0),
    ("tensorflow-horovod", 4, None, 0),
    ("tensorflow-ddl", 2, None, 0),
]


def manifest(framework: str, nodes: int, requested: int | None) -> Manifest:
    fw: dict[str, Any] = {"name": framework}
    if requested is not None:
        fw["parameter_servers"] = requested
    return load_manifest(
        base(framework=fw, compute_configuration={"nodes": nodes}), DEFAULT_CATALOG, "standard"
    )


@pytest.mark.parametrize(("framework", "nodes", "requested", "count"), DEFAULT_CASES)
def test_the_default_catalog(framework: str, nodes: int, requested: int | None, count: int) -> None:
    assert manifest(framework, nodes, requested).parameter_servers_in(DEFAULT_CATALOG) == count


def stored(m: Manifest) -> Training:
    """The training row the API stores for `m` (its document as the API stores it)."""
    return Training(
        id="t1",
        framework_name=m.framework.name,
        framework_version=m.framework.version,
        compute_name=m.compute_configuration.name,
        nodes=m.nodes,
        manifest=m.model_dump(mode="json", exclude_none=True),
    )


def platform_with(catalog: Catalog) -> Platform:
    return cast(Platform, SimpleNamespace(catalog=catalog))


@pytest.mark.parametrize(("framework", "nodes", "requested", "count"), DEFAULT_CASES)
def test_the_worker_reads_the_stored_manifest_by_the_same_rule(
    framework: str, nodes: int, requested: int | None, count: int
) -> None:
    spec = training_spec(
        stored(manifest(framework, nodes, requested)), platform_with(DEFAULT_CATALOG)
    )
    assert spec.parameter_servers == count
    assert spec.distribution == DEFAULT_CATALOG.frameworks[framework].distribution


OPERATOR = DEFAULT_CATALOG.with_overrides(
    {
        "frameworks": {
            "tensorflow": {"versions": ["1.5"], "distribution": "mpi"},
            "tf-cluster": {"versions": ["1.5"], "distribution": "parameter_server"},
        }
    }
)


@pytest.mark.parametrize(
    ("framework", "nodes", "requested", "count"),
    [
        ("tf-cluster", 1, None, 0),
        ("tf-cluster", 3, None, 1),
        ("tf-cluster", 3, 2, 2),
        ("tensorflow", 3, None, 0),
    ],
)
def test_the_catalog_says_which_frameworks_take_parameter_servers(
    framework: str, nodes: int, requested: int | None, count: int
) -> None:
    fw: dict[str, Any] = {"name": framework}
    if requested is not None:
        fw["parameter_servers"] = requested
    m = load_manifest(
        base(framework=fw, compute_configuration={"nodes": nodes}), OPERATOR, "standard"
    )
    assert m.parameter_servers_in(OPERATOR) == count
    assert training_spec(stored(m), platform_with(OPERATOR)).parameter_servers == count


def test_parameter_servers_are_refused_where_the_catalog_distributes_by_mpi() -> None:
    doc = base(
        framework={"name": "tensorflow", "parameter_servers": 1}, compute_configuration={"nodes": 3}
    )
    with pytest.raises(ValidationFailed) as info:
        load_manifest(doc, OPERATOR, "standard")
    assert [(e.field, e.message) for e in info.value.errors] == [
        ("/framework/parameter_servers", "applies only to tensorflow trainings with nodes > 1")
    ]


def test_a_framework_gone_from_the_catalog_launches_as_a_parameter_server_cluster() -> None:
    """As before: the worker falls back to the parameter-server launcher, and the count
    follows the distribution it launches with."""
    training = stored(manifest("tensorflow", 3, None))
    spec = training_spec(training, platform_with(OPERATOR.with_overrides({"frameworks": {}})))
    assert (spec.distribution, spec.parameter_servers) == ("parameter_server", 1)
