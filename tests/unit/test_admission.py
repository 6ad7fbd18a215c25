"""Gang admission, table-driven: plan concurrency, the plan's learner slots per tenant
(max_active_nodes), free capacity, oldest first."""

from __future__ import annotations

import pytest

from service.domain.admission import Candidate, NodeLimitWait, admit
from service.domain.catalog import DEFAULT_CATALOG, PlanSpec


def c(tid: str, tenant: str = "a", nodes: int = 1) -> Candidate:
    return Candidate(tid, tenant, nodes)


@pytest.mark.parametrize(
    ("queued", "active", "concurrency", "free", "expected"),
    [
        ([c("t1"), c("t2")], {}, {"a": 8}, 8, ["t1", "t2"]),
        # gang: a 3-node training needs 3 free slots, all at once
        ([c("t1", nodes=3)], {}, {"a": 8}, 2, []),
        ([c("t1", nodes=3)], {}, {"a": 8}, 3, ["t1"]),
        # strict order on capacity: a big one at the head is not overtaken
        ([c("t1", nodes=4), c("t2", nodes=1)], {}, {"a": 8}, 2, []),
        # the lite plan: one at a time per tenant; others' trainings are not held back
        (
            [c("t1", "lite"), c("t2", "lite"), c("t3", "std")],
            {},
            {"lite": 1, "std": 8},
            8,
            ["t1", "t3"],
        ),
        ([c("t1", "lite")], {"lite": 1}, {"lite": 1}, 8, []),
        ([c("t1", "a", 2), c("t2", "a", 2)], {"a": 7}, {"a": 8}, 8, ["t1"]),
        ([], {}, {}, 8, []),
        # a tenant whose plan is not known (not in concurrency) waits
        ([c("t1", "gone"), c("t2")], {}, {"a": 8}, 8, ["t2"]),
    ],
)
def test_admit(
    queued: list[Candidate],
    active: dict[str, int],
    concurrency: dict[str, int],
    free: int,
    expected: list[str],
) -> None:
    admission = admit(
        queued, active_per_tenant=active, concurrency_per_tenant=concurrency, free_slots=free
    )
    assert admission.started == expected
    assert admission.waiting_on_nodes == {}  # no node limit given: none waits on one


ANY = {"a": 100, "b": 100, "c": 100}


@pytest.mark.parametrize(
    ("queued", "nodes_held", "limits", "free", "expected", "waiting"),
    [
        # under the limit: as without it
        ([c("t1", "a", 2), c("t2", "a", 2)], {}, {"a": 4}, 8, ["t1", "t2"], {}),
        # exactly at the limit after the first: the second waits, saying so
        (
            [c("t1", "a", 2), c("t2", "a", 2), c("t3", "a", 1)],
            {},
            {"a": 4},
            8,
            ["t1", "t2"],
            {"t3": NodeLimitWait(4, 4)},
        ),
        # the slots already held count: 3 held of 4, a 2-node training waits
        ([c("t1", "a", 2)], {"a": 3}, {"a": 4}, 8, [], {"t1": NodeLimitWait(4, 3)}),
        # ... and a 1-node one fits
        ([c("t1", "a", 1)], {"a": 3}, {"a": 4}, 8, ["t1"], {}),
        # a tenant at its limit does not hold other tenants back (the hog and the rest)
        (
            [c("a1", "a", 2), c("a2", "a", 2), c("a3", "a", 2), c("b1", "b", 2)],
            {},
            {"a": 4, "b": 4},
            8,
            ["a1", "a2", "b1"],
            {"a3": NodeLimitWait(4, 4)},
        ),
        # the hog already holds its share: the other tenant gets the free slots
        (
            [c("a1", "a", 1), c("a2", "a", 1), c("b1", "b", 1)],
            {"a": 6},
            {"a": 6, "b": 6},
            2,
            ["b1"],
            {"a1": NodeLimitWait(6, 6), "a2": NodeLimitWait(6, 6)},
        ),
        # oldest first within a tenant: a small later training does not overtake a big
        # older one of the same tenant waiting on the limit
        (
            [c("t1", "a", 3), c("t2", "a", 1)],
            {"a": 2},
            {"a": 4},
            8,
            [],
            {"t1": NodeLimitWait(4, 2), "t2": NodeLimitWait(4, 2)},
        ),
        # gang start still: within the limit but not in the free slots, admission stops
        # (a later tenant's small training is not let past it)
        ([c("t1", "a", 3), c("b1", "b", 1)], {}, {"a": 4, "b": 4}, 2, [], {}),
        # a training held by the limit does not stop the pass for capacity
        (
            [c("a1", "a", 3), c("b1", "b", 2)],
            {"a": 2},
            {"a": 4, "b": 4},
            2,
            ["b1"],
            {"a1": NodeLimitWait(4, 2)},
        ),
        # a training bigger than the limit waits (submission refuses those; a plan changed)
        ([c("t1", "a", 5)], {}, {"a": 4}, 8, [], {"t1": NodeLimitWait(4, 0)}),
        # a tenant with no limit given is bounded by capacity alone
        ([c("t1", "c", 8)], {"c": 0}, {}, 8, ["t1"], {}),
        # several tenants each at their own limit
        (
            [c("a1", "a", 1), c("b1", "b", 1), c("c1", "c", 1)],
            {"a": 2, "b": 1},
            {"a": 2, "b": 2, "c": 1},
            8,
            ["b1", "c1"],
            {"a1": NodeLimitWait(2, 2)},
        ),
    ],
)
def test_admit_bounds_the_learner_slots_of_each_tenant(
    queued: list[Candidate],
    nodes_held: dict[str, int],
    limits: dict[str, int],
    free: int,
    expected: list[str],
    waiting: dict[str, NodeLimitWait],
) -> None:
    admission = admit(
        queued,
        active_per_tenant={},
        concurrency_per_tenant=ANY,
        free_slots=free,
        active_nodes_per_tenant=nodes_held,
        node_limit_per_tenant=limits,
    )
    assert admission.started == expected
    assert admission.waiting_on_nodes == waiting


def test_concurrency_and_node_limit_together() -> None:
    """At its concurrency a tenant waits without a node-limit message; below it, the node
    limit decides."""
    queued = [c("a1", "a", 1), c("b1", "b", 3)]
    admission = admit(
        queued,
        active_per_tenant={"a": 1, "b": 1},
        concurrency_per_tenant={"a": 1, "b": 8},
        free_slots=8,
        active_nodes_per_tenant={"a": 1, "b": 2},
        node_limit_per_tenant={"a": 8, "b": 4},
    )
    assert admission.started == []
    assert admission.waiting_on_nodes == {"b1": NodeLimitWait(4, 2)}


def test_the_waiting_message_names_the_limit_and_the_use() -> None:
    assert NodeLimitWait(4, 3).message() == "waiting: the plan allows 4 active learners; 3 in use"


def test_max_active_nodes_defaults_to_no_bound_beyond_the_plans_others() -> None:
    standard = DEFAULT_CATALOG.plans["standard"]
    assert standard.max_active_nodes is None
    assert standard.active_nodes_limit == standard.max_nodes * standard.max_concurrent_trainings
    set_ = PlanSpec(
        distributed=True,
        max_nodes=4,
        max_concurrent_trainings=8,
        predictions_per_minute=10,
        max_active_nodes=6,
    )
    assert set_.active_nodes_limit == 6
    with pytest.raises(ValueError, match="max_active_nodes"):
        PlanSpec.model_validate({**set_.model_dump(), "max_active_nodes": 0})
