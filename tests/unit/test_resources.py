"""Resources as FfDL and Kubernetes write them (service.domain.resources), table-tested:
memory to bytes, CPUs to a number, and the smallest compute configuration that holds them."""

from __future__ import annotations

import pytest

from service.domain.catalog import DEFAULT_CATALOG, Catalog, ComputeSpec
from service.domain.resources import (
    NoComputeConfiguration,
    parse_cpus,
    parse_memory,
    smallest_compute,
)

GiB = 2**30
MiB = 2**20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # FfDL's forms: a unit of MB, MiB, GB or GiB, any case, "1Gb" its own example.
        ("1Gb", 10**9),
        ("1GB", 10**9),
        ("1gb", 10**9),
        ("1GiB", GiB),
        ("1gib", GiB),
        ("512MiB", 512 * MiB),
        ("512MB", 512 * 10**6),
        ("512mb", 512 * 10**6),
        ("2 GB", 2 * 10**9),
        ("1.5GiB", 3 * GiB // 2),
        ("1TB", 10**12),
        # Kubernetes' quantities.
        ("1Gi", GiB),
        ("512Mi", 512 * MiB),
        ("64Ki", 64 * 1024),
        ("1G", 10**9),
        ("500M", 500 * 10**6),
        ("100M", 100 * 10**6),
        ("1k", 1000),
        ("1e9", 10**9),
        ("1E3", 1000),
        ("2048", 2048),
        ("0.5Gi", GiB // 2),
        ("1500m", 2),  # milli-bytes, rounded up to a whole byte
        ("+1Gi", GiB),
        (2048, 2048),
        (1.5, 2),
        (0, 0),
    ],
)
def test_memory_forms(text: str | int | float, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "Gb", "1 Gigabyte", "1XB", "-1Gi", "-5", "1g", "1gi", "1Gi5", "1e99", "abc", -1, True],
)
def test_bad_memory_is_refused_naming_the_rule(text: str | int) -> None:
    with pytest.raises(ValueError, match="memory is a number of bytes with a unit"):
        parse_memory(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2, 2.0),
        (0.5, 0.5),
        ("2", 2.0),
        ("1.5", 1.5),
        ("500m", 0.5),
        ("2000m", 2.0),
        ("1e1", 10.0),
        (0, 0.0),
    ],
)
def test_cpu_forms(value: str | int | float, expected: float) -> None:
    assert parse_cpus(value) == expected


@pytest.mark.parametrize("value", ["", "two", "-1", -0.5, "1Gi5", "5x", False])
def test_bad_cpus_are_refused_naming_the_rule(value: str | float) -> None:
    with pytest.raises(ValueError, match="cpus is a number of CPUs"):
        parse_cpus(value)


@pytest.mark.parametrize(
    ("gpus", "cpus", "memory", "nodes", "expected"),
    [
        # Fewest GPUs first, then CPUs, then memory; the name breaks ties (K80 < V100).
        (0, 1, GiB, 1, "K80"),
        (1, 4, 24 * GiB, 1, "K80"),
        (1, 5, GiB, 1, "P100"),  # 8 CPUs; P100 and V100 tie, P100's name is first
        (2, 1, GiB, 1, "K80x2"),
        (2, 9, GiB, 1, "P100x2"),
        (0, 0.5, 10**9, 1, "K80"),
        # More than one node needs a configuration that supports distributed training.
        (1, 1, GiB, 2, "P100"),
        (2, 1, GiB, 4, "P100x2"),
    ],
)
def test_smallest_compute_of_the_default_catalog(
    gpus: int, cpus: float, memory: int, nodes: int, expected: str
) -> None:
    assert (
        smallest_compute(DEFAULT_CATALOG, gpus=gpus, cpus=cpus, memory_bytes=memory, nodes=nodes)
        == expected
    )


def _catalog(**configurations: ComputeSpec) -> Catalog:
    return DEFAULT_CATALOG.model_copy(update={"compute_configurations": configurations})


def test_smallest_means_gpus_then_cpus_then_memory_then_name() -> None:
    catalog = _catalog(
        big=ComputeSpec(gpus=0, cpus=8, memory_gib=64),
        b=ComputeSpec(gpus=0, cpus=2, memory_gib=8),
        a=ComputeSpec(gpus=0, cpus=2, memory_gib=8),
        lean=ComputeSpec(gpus=0, cpus=2, memory_gib=4),
        gpu=ComputeSpec(gpus=1, cpus=1, memory_gib=1),
    )
    assert smallest_compute(catalog, gpus=0, cpus=1, memory_bytes=GiB, nodes=1) == "lean"
    assert smallest_compute(catalog, gpus=0, cpus=1, memory_bytes=5 * GiB, nodes=1) == "a"
    assert smallest_compute(catalog, gpus=0, cpus=3, memory_bytes=GiB, nodes=1) == "big"
    assert smallest_compute(catalog, gpus=1, cpus=1, memory_bytes=GiB, nodes=1) == "gpu"


@pytest.mark.parametrize(
    ("gpus", "cpus", "memory", "nodes", "resources", "says"),
    [
        (4, 1, GiB, 1, ("gpus",), "no compute configuration offers 4 GPU(s)"),
        (1, 64, GiB, 1, ("cpus",), "no compute configuration offers 64 CPU(s)"),
        (1, 1, 100 * GiB, 1, ("memory",), "no compute configuration offers 100 GiB of memory"),
    ],
)
def test_what_no_configuration_holds_is_named(
    gpus: int, cpus: float, memory: int, nodes: int, resources: tuple[str, ...], says: str
) -> None:
    with pytest.raises(NoComputeConfiguration) as info:
        smallest_compute(DEFAULT_CATALOG, gpus=gpus, cpus=cpus, memory_bytes=memory, nodes=nodes)
    assert info.value.resources == resources
    assert says in str(info.value)
    assert "offered: K80: 1 GPU(s), 4 CPU(s), 24 GiB" in str(info.value)


def test_resources_each_offered_but_not_together() -> None:
    catalog = _catalog(
        cpu=ComputeSpec(gpus=0, cpus=16, memory_gib=64),
        gpu=ComputeSpec(gpus=1, cpus=2, memory_gib=8),
    )
    with pytest.raises(NoComputeConfiguration) as info:
        smallest_compute(catalog, gpus=1, cpus=16, memory_bytes=GiB, nodes=1)
    assert info.value.resources == ("gpus", "cpus", "memory")
    assert "holds 1 GPU(s), 16 CPU(s)" in info.value.message
    assert "together" in info.value.message
    assert smallest_compute(catalog, gpus=1, cpus=2, memory_bytes=GiB, nodes=1) == "gpu"


def test_distributed_training_where_no_configuration_offers_it() -> None:
    catalog = _catalog(single=ComputeSpec(gpus=1, cpus=4, memory_gib=16))
    with pytest.raises(NoComputeConfiguration) as info:
        smallest_compute(catalog, gpus=1, cpus=1, memory_bytes=GiB, nodes=2)
    assert info.value.resources == ("nodes",)
    assert "distributed training" in info.value.message
    assert smallest_compute(catalog, gpus=1, cpus=1, memory_bytes=GiB, nodes=1) == "single"
