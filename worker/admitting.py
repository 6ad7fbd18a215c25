"""The monitor's admission step: which queued trainings start now (the rules are
service.domain.admission's), recorded in the database with their LAUNCH to send.

A queued training held back by its plan's max_active_nodes says so in its status_message
(and no longer once that limit does not hold it); one that can never start (more learners
than the platform's slots, or than its plan's max_active_nodes) is failed, saying why.

A backend that knows what fits it now (FitsCapacity: the Kubernetes backend's nodes) is
asked instead of its slots: a training that does not fit waits QUEUED, its status_message
naming what it needs and what fits now; one more than the matching nodes could ever hold
is failed, naming its compute configuration.

The way back: a training whose gang the cluster could not place in time
(service.domain.gang_release) is queued again as a new attempt, its pods stopped now, or
failed when it was queued again before (`release_gang`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy.orm import Session

from service.db import repository
from service.db.models import Training
from service.dispatch import FINALIZE, LAUNCH, STOP
from service.domain.admission import WAITING_PREFIX, Candidate, admit
from service.domain.catalog import ComputeSpec, PlanSpec
from service.domain.gang_release import Release
from service.domain.states import TrainingState
from service.trainings import record_requeue, record_transition
from worker.backends.base import Backend, CapacityFit, FitsCapacity


def admit_queued(
    session: Session,
    plans_offered: dict[str, PlanSpec],
    backend: Backend,
    outbox: list[tuple[str, str]],
    computes: Mapping[str, ComputeSpec] | None = None,
) -> None:
    """Move the trainings admitted now to PENDING and add their LAUNCH to `outbox`
    (`computes`: the compute configurations offered, for a backend that fits them).

    The queue is read only as far as admission goes (`repository.queued_in_order`): on a
    busy platform it stops at the first training, and a pass follows every submission.
    Those that can never start are found by the database (`queued_above`), where the
    backend counts slots; a backend that fits learners onto its nodes weighs every one,
    read once."""
    plan_of = repository.plans_of_queuing_tenants(session)
    if not plan_of:
        return
    load = repository.active_load(session)
    plans = {tid: plans_offered[plan] for tid, plan in plan_of.items() if plan in plans_offered}
    slots = backend.slots()
    fit: CapacityFit | None = None
    if isinstance(backend, FitsCapacity):
        fit = backend.fit(repository.starting_candidates(session), computes or {})
    never_fit: dict[str, str] = {}
    queued: Iterable[Candidate]
    if fit is not None:
        weighed = repository.queued_candidates(session)
        queued = weighed
        for c in weighed:
            if (why := fit.never(c)) is not None:
                never_fit[c.training_id] = why
    else:
        # No training with at most this many learners can be over either bound.
        bound = min([slots, *(p.active_nodes_limit for p in plans.values())])
        weighed = repository.queued_above(session, bound)
        queued = repository.queued_in_order(session)  # read only as admission goes on
        for c in weighed:
            if c.nodes > slots:
                never_fit[c.training_id] = (
                    f"capacity: {c.nodes} learners can never fit this platform's {slots} "
                    "learner slots"
                )
    for c in weighed:
        if c.training_id not in never_fit and c.tenant_id in plans:
            limit = plans[c.tenant_id].active_nodes_limit
            if c.nodes > limit:
                # Accepted under a plan that allowed more (the catalog changed since).
                never_fit[c.training_id] = (
                    f"capacity: {c.nodes} learners can never fit the plan's {limit} active "
                    "learners (max_active_nodes)"
                )
    admission = admit(
        (c for c in queued if c.training_id not in never_fit),
        active_per_tenant=load.trainings,
        concurrency_per_tenant={tid: p.max_concurrent_trainings for tid, p in plans.items()},
        free_slots=slots - load.total_nodes,
        active_nodes_per_tenant=load.nodes,
        node_limit_per_tenant={tid: p.active_nodes_limit for tid, p in plans.items()},
        fit=fit,
    )
    admitted = set(admission.started)
    waiting = {tid: wait.message() for tid, wait in admission.waiting_on_nodes.items()}
    waiting |= {tid: WAITING_PREFIX + why for tid, why in admission.waiting_on_capacity.items()}
    repository.set_queued_messages(session, waiting, WAITING_PREFIX)
    # Only the trainings that change are loaded as objects (most of a queue waits).
    for training in repository.queued_trainings_among(session, admitted | set(never_fit)):
        if training.id in admitted:
            record_transition(
                training, TrainingState.PENDING, f"starting {training.nodes} learner(s)"
            )
            outbox.append((LAUNCH, training.id))
        else:
            record_transition(training, TrainingState.FAILED, never_fit[training.id])


def release_gang(
    training: Training, release: Release, now: datetime, outbox: list[tuple[str, str]]
) -> None:
    """Apply a gang release: queue the training again as its next attempt and STOP this
    attempt's pods (their GPUs are free at once; the LAUNCH after its next admission
    cleans up the rest), or fail it and FINALIZE."""
    if release.requeue:
        record_requeue(training, release.message, at=now)
        outbox.append((STOP, training.id))
    else:
        record_transition(training, TrainingState.FAILED, release.message, at=now)
        outbox.append((FINALIZE, training.id))
