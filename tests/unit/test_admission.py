"""Gang admission, table-driven."""

from __future__ import annotations

import pytest

from service.domain.admission import Candidate, admit


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
    ],
)
def test_admit(
    queued: list[Candidate],
    active: dict[str, int],
    concurrency: dict[str, int],
    free: int,
    expected: list[str],
) -> None:
    assert (
        admit(queued, active_per_tenant=active, concurrency_per_tenant=concurrency, free_slots=free)
        == expected
    )
