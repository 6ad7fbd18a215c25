"""Bounded use per tenant: what a plan allows a tenant to hold at once, and the
max_runtime a training gets. Pure rules; the services count the tenant's use and ask.

A limit reached is a refusal naming the limit, what the plan allows and what the tenant
uses now (the API answers it with 429: the same request succeeds once the tenant has
less in the queue or fewer deployments). A max_runtime above the plan's maximum is a
manifest error (422 naming `/max_runtime`).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.domain.catalog import PlanSpec
from service.errors import FieldError


@dataclass(frozen=True)
class LimitReached:
    """A limit of the tenant's plan that one more would go over."""

    limit: str  # the PlanSpec field, e.g. "max_queued_trainings"
    allowed: int
    used: int
    message: str


def check_queued_trainings(plan_name: str, plan: PlanSpec, queued: int) -> LimitReached | None:
    """One more QUEUED training, with `queued` already waiting."""
    if queued < plan.max_queued_trainings:
        return None
    return LimitReached(
        "max_queued_trainings",
        plan.max_queued_trainings,
        queued,
        f"the {plan_name} plan allows {plan.max_queued_trainings} queued trainings; "
        f"you have {queued}. Submit again when one has started or been stopped",
    )


def check_deployments(plan_name: str, plan: PlanSpec, deployments: int) -> LimitReached | None:
    """One more deployment, with `deployments` already kept."""
    if deployments < plan.max_deployments:
        return None
    return LimitReached(
        "max_deployments",
        plan.max_deployments,
        deployments,
        f"the {plan_name} plan allows {plan.max_deployments} deployments; "
        f"you have {deployments}. Delete one to deploy another",
    )


def check_stored_bytes(
    plan_name: str, plan: PlanSpec, stored: int, adding: int
) -> LimitReached | None:
    """`adding` more bytes (a code archive), with `stored` already kept."""
    if stored + adding <= plan.max_stored_bytes:
        return None
    return LimitReached(
        "max_stored_bytes",
        plan.max_stored_bytes,
        stored,
        f"the {plan_name} plan allows {plan.max_stored_bytes} bytes stored; you have {stored} "
        f"and this adds {adding}. Delete trainings you no longer need",
    )


def learner_log_cap(plan: PlanSpec, nodes: int) -> int:
    """The log bytes each learner of a training of `nodes` learners may write: an equal
    share of the plan's max_log_bytes_per_training (each learner's wrapper counts its own,
    so the training's total stays within the plan's)."""
    return max(1, plan.max_log_bytes_per_training // max(1, nodes))


def max_runtime_errors(plan_name: str, plan: PlanSpec, max_runtime: int | None) -> list[FieldError]:
    """A max_runtime the manifest names is at most the plan's maximum."""
    if max_runtime is None or max_runtime <= plan.max_max_runtime:
        return []
    return [
        FieldError(
            "/max_runtime",
            f"the {plan_name} plan allows at most {plan.max_max_runtime} s; got {max_runtime}",
        )
    ]


def effective_max_runtime(plan: PlanSpec, max_runtime: int | None) -> int:
    """The max_runtime a training runs under: the manifest's, or the plan's default."""
    return plan.default_max_runtime if max_runtime is None else max_runtime
