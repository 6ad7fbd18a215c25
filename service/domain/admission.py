"""Which queued trainings may start now (pure).

A training starts all of its learners or none (gang start): it is admitted only when the
backend has a free slot for every one of its nodes. Trainings are considered oldest first;
one whose tenant is at its plan's concurrency (`max_concurrent_trainings`) or would go over
its plan's learner slots (`max_active_nodes`) waits without holding other tenants back, and
a tenant's later trainings wait behind it (oldest first within a tenant); but one that does
not fit the free capacity stops admission for this pass, so large trainings are not starved
by a stream of small ones.

Free capacity is the backend's slots less the learners active trainings hold, or, where
the backend knows what fits it (`Fit`: the Kubernetes backend packs learners onto its
nodes), what that says; each training admitted takes its part before the next is weighed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

# The start of the status_message of a QUEUED training held back by its plan's
# max_active_nodes: the monitor writes it, and clears it once that no longer holds.
NODE_LIMIT_MESSAGE = "waiting: the plan allows"
# The start of every status_message admission writes on a QUEUED training (cleared once
# it no longer holds).
WAITING_PREFIX = "waiting: "


@dataclass(frozen=True)
class Candidate:
    training_id: str
    tenant_id: str
    nodes: int
    compute: str = ""
    """Its compute configuration's name."""


class Fit(Protocol):
    """What fits the backend now, taken from as trainings are admitted."""

    def take(self, candidate: Candidate) -> str | None:
        """None: the training fits now, and what it needs is taken; else why it waits."""
        ...


@dataclass(frozen=True)
class NodeLimitWait:
    """A queued training that waits because its tenant's active trainings hold `in_use` of
    the `limit` learner slots its plan allows (max_active_nodes)."""

    limit: int
    in_use: int

    def message(self) -> str:
        return f"{NODE_LIMIT_MESSAGE} {self.limit} active learners; {self.in_use} in use"


@dataclass(frozen=True)
class Admission:
    started: list[str] = field(default_factory=list)
    """The ids of the trainings to start now, oldest first."""
    waiting_on_nodes: dict[str, NodeLimitWait] = field(default_factory=dict)
    """The trainings held back by their plan's max_active_nodes (by id)."""
    waiting_on_capacity: dict[str, str] = field(default_factory=dict)
    """The training that stopped this pass for want of room (by id): why, from `Fit`."""


def admit(
    queued: Iterable[Candidate],
    *,
    active_per_tenant: Mapping[str, int],
    concurrency_per_tenant: Mapping[str, int],
    free_slots: int,
    active_nodes_per_tenant: Mapping[str, int] | None = None,
    node_limit_per_tenant: Mapping[str, int] | None = None,
    fit: Fit | None = None,
) -> Admission:
    """Which of the queued trainings (oldest first in `queued`) start now. `queued` is
    read only as far as it must be: up to the first training that does not fit.

    `active_nodes_per_tenant`: the learners each tenant's active trainings hold;
    `node_limit_per_tenant`: how many its plan allows (a tenant not in it: no limit);
    `fit`: what fits the backend (instead of `free_slots`), where it knows."""
    result = Admission()
    active = dict(active_per_tenant)
    nodes_held = dict(active_nodes_per_tenant or {})
    node_limits = node_limit_per_tenant or {}
    held_tenants: set[str] = set()
    for candidate in queued:
        tenant = candidate.tenant_id
        if active.get(tenant, 0) >= concurrency_per_tenant.get(tenant, 0):
            continue
        limit = node_limits.get(tenant)
        in_use = nodes_held.get(tenant, 0)
        if tenant in held_tenants or (limit is not None and in_use + candidate.nodes > limit):
            # Its later trainings wait behind it, however small: oldest first.
            held_tenants.add(tenant)
            if limit is not None:
                result.waiting_on_nodes[candidate.training_id] = NodeLimitWait(limit, in_use)
            continue
        if fit is not None:
            why = fit.take(candidate)
            if why is not None:
                result.waiting_on_capacity[candidate.training_id] = why
                break
        elif candidate.nodes > free_slots:
            break
        result.started.append(candidate.training_id)
        free_slots -= candidate.nodes
        active[tenant] = active.get(tenant, 0) + 1
        nodes_held[tenant] = in_use + candidate.nodes
    return result
