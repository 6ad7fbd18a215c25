"""Which queued trainings may start now (pure).

A training starts all of its learners or none (gang start): it is admitted only when the
backend has a free slot for every one of its nodes. Trainings are considered oldest first;
one whose tenant is at its plan's concurrency waits without holding others back, but one
that does not fit the free capacity stops admission for this pass, so large trainings are
not starved by a stream of small ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    training_id: str
    tenant_id: str
    nodes: int


def admit(
    queued: Sequence[Candidate],
    *,
    active_per_tenant: Mapping[str, int],
    concurrency_per_tenant: Mapping[str, int],
    free_slots: int,
) -> list[str]:
    """The ids of the queued trainings (oldest first in `queued`) to start now."""
    admitted: list[str] = []
    active = dict(active_per_tenant)
    for candidate in queued:
        if active.get(candidate.tenant_id, 0) >= concurrency_per_tenant.get(candidate.tenant_id, 0):
            continue
        if candidate.nodes > free_slots:
            break
        admitted.append(candidate.training_id)
        free_slots -= candidate.nodes
        active[candidate.tenant_id] = active.get(candidate.tenant_id, 0) + 1
    return admitted
