"""The plan's limits on what a tenant holds at once, and the max_runtime rules."""

from __future__ import annotations

import pytest

from service.domain import quotas
from service.domain.catalog import DEFAULT_CATALOG, Catalog, PlanSpec

STANDARD = DEFAULT_CATALOG.plans["standard"]
LITE = DEFAULT_CATALOG.plans["lite"]


@pytest.mark.parametrize(
    ("plan_name", "queued", "refused"),
    [
        ("standard", 0, False),
        ("standard", STANDARD.max_queued_trainings - 1, False),
        ("standard", STANDARD.max_queued_trainings, True),
        ("standard", STANDARD.max_queued_trainings + 3, True),  # the limit was lowered
        ("lite", LITE.max_queued_trainings - 1, False),
        ("lite", LITE.max_queued_trainings, True),
    ],
)
def test_queued_trainings(plan_name: str, queued: int, refused: bool) -> None:
    plan = DEFAULT_CATALOG.plans[plan_name]
    reached = quotas.check_queued_trainings(plan_name, plan, queued)
    assert (reached is not None) is refused
    if reached is not None:
        assert reached.limit == "max_queued_trainings"
        assert (reached.allowed, reached.used) == (plan.max_queued_trainings, queued)
        assert reached.message.startswith(
            f"the {plan_name} plan allows {plan.max_queued_trainings} queued trainings; "
            f"you have {queued}"
        )


@pytest.mark.parametrize(
    ("plan_name", "kept", "refused"),
    [
        ("standard", 0, False),
        ("standard", STANDARD.max_deployments - 1, False),
        ("standard", STANDARD.max_deployments, True),
        ("lite", LITE.max_deployments, True),
    ],
)
def test_deployments(plan_name: str, kept: int, refused: bool) -> None:
    plan = DEFAULT_CATALOG.plans[plan_name]
    reached = quotas.check_deployments(plan_name, plan, kept)
    assert (reached is not None) is refused
    if reached is not None:
        assert reached.limit == "max_deployments"
        assert f"allows {plan.max_deployments} deployments; you have {kept}" in reached.message


@pytest.mark.parametrize(
    ("requested", "effective", "errors"),
    [
        (None, LITE.default_max_runtime, 0),
        (60, 60, 0),
        (LITE.max_max_runtime, LITE.max_max_runtime, 0),
        (LITE.max_max_runtime + 1, LITE.max_max_runtime + 1, 1),
    ],
)
def test_max_runtime(requested: int | None, effective: int, errors: int) -> None:
    assert quotas.effective_max_runtime(LITE, requested) == effective
    found = quotas.max_runtime_errors("lite", LITE, requested)
    assert len(found) == errors
    for e in found:
        assert e.field == "/max_runtime"
        assert f"the lite plan allows at most {LITE.max_max_runtime} s" in e.message


def test_lite_is_smaller_than_standard() -> None:
    for limit in (
        "max_queued_trainings",
        "max_deployments",
        "max_stored_bytes",
        "max_log_bytes_per_training",
        "max_max_runtime",
    ):
        assert getattr(LITE, limit) < getattr(STANDARD, limit), limit


def test_an_operators_plan_without_limits_gets_the_defaults() -> None:
    catalog = DEFAULT_CATALOG.with_overrides(
        {
            "plans": {
                "old": {
                    "distributed": False,
                    "max_nodes": 1,
                    "max_concurrent_trainings": 1,
                    "predictions_per_minute": 10,
                }
            }
        }
    )
    assert (
        catalog.plans["old"].max_queued_trainings
        == PlanSpec.model_fields["max_queued_trainings"].default
    )


def test_a_default_runtime_above_the_maximum_is_refused() -> None:
    plan = LITE.model_dump() | {"default_max_runtime": 100, "max_max_runtime": 50}
    with pytest.raises(ValueError, match="default_max_runtime"):
        Catalog.model_validate({**DEFAULT_CATALOG.model_dump(), "plans": {"p": plan}})


@pytest.mark.parametrize(
    ("stored", "adding", "refused"),
    [
        (0, 0, False),
        (0, LITE.max_stored_bytes, False),
        (1, LITE.max_stored_bytes, True),
        (LITE.max_stored_bytes - 10, 10, False),
        (LITE.max_stored_bytes - 10, 11, True),
        (LITE.max_stored_bytes + 5, 0, True),  # the limit was lowered
    ],
)
def test_stored_bytes(stored: int, adding: int, refused: bool) -> None:
    reached = quotas.check_stored_bytes("lite", LITE, stored, adding)
    assert (reached is not None) is refused
    if reached is not None:
        assert (reached.limit, reached.allowed, reached.used) == (
            "max_stored_bytes",
            LITE.max_stored_bytes,
            stored,
        )
        assert (
            f"the lite plan allows {LITE.max_stored_bytes} bytes stored; you have {stored} "
            f"and this adds {adding}" in reached.message
        )


@pytest.mark.parametrize(
    ("nodes", "share"),
    [
        (1, LITE.max_log_bytes_per_training),
        (2, LITE.max_log_bytes_per_training // 2),
        (3, LITE.max_log_bytes_per_training // 3),
    ],
)
def test_each_learner_gets_an_equal_share_of_the_log_bytes(nodes: int, share: int) -> None:
    assert quotas.learner_log_cap(LITE, nodes) == share
    assert quotas.learner_log_cap(LITE, nodes) * nodes <= LITE.max_log_bytes_per_training
