"""How a training's state follows its learners (pure; the monitor applies the decisions).

Gang semantics: all learners must progress; one learner failing (exiting non-zero, lost,
or stopped) fails the training and stops the others. A learner that exits 0 is never a
failure. The training completes when every *primary* learner has exited 0 (the only
learner; the workers of a parameter-server training; the MPI launcher; every learner's
torchrun of a PyTorch training); the others
(parameter servers, MPI hosts) usually never exit on their own and are stopped then. A
secondary learner that exits 0 before that is recorded (COMPLETED) and does not fail it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from service.domain.retries import Retries, final_message, retry_cause, retrying_message
from service.domain.states import TrainingState


@dataclass(frozen=True)
class LearnerObservation:
    learner_id: int
    # PENDING, DOWNLOADING, RUNNING, STORING, COMPLETED, FAILED, HALTED, or LOST (the
    # learner is gone without reporting an end).
    phase: str
    exit_code: int | None = None
    message: str | None = None
    # When the learner entered each phase it went through (epoch seconds).
    phases: tuple[tuple[str, float], ...] = ()

    @property
    def ended(self) -> bool:
        return self.phase in ("COMPLETED", "FAILED", "HALTED", "LOST")


class Action(StrEnum):
    STOP = "stop"  # stop every learner (the training is ending or asked to stop)
    FINALIZE = "finalize"  # the training is terminal: stop what is left, archive, clean up
    # The attempt failed in a way its retry_policy covers: record the next attempt and
    # start it (the worker stops what is left of this one and saves its checkpoints first).
    RETRY = "retry"


@dataclass(frozen=True)
class Decision:
    state: TrainingState | None = None  # the new state, if it changes
    message: str | None = None
    actions: tuple[Action, ...] = field(default=())


_ORDER = {
    "PENDING": TrainingState.PENDING,
    "DOWNLOADING": TrainingState.DOWNLOADING,
    "RUNNING": TrainingState.RUNNING,
    "STORING": TrainingState.STORING,
}
_PROGRESS = list(_ORDER.values())


def _failure(obs: LearnerObservation) -> str:
    if obs.message and obs.phase in ("FAILED", "LOST"):
        return obs.message
    if obs.exit_code is not None:
        return f"learner {obs.learner_id} exited with code {obs.exit_code}"
    return f"learner {obs.learner_id} ended ({obs.phase.lower()}) before the training completed"


def decide(
    current: TrainingState,
    learners: Sequence[LearnerObservation],
    primaries: Sequence[int],
    *,
    stop_requested: bool,
    started_at: datetime | None,
    max_runtime: int | None,
    now: datetime,
    attempt: int = 1,
    retries: Retries | None = None,
) -> Decision:
    """The next step for an active (PENDING..STORING) training in its `attempt`, whose
    manifest's retry policy is `retries`; `started_at` is when this attempt started
    running (max_runtime bounds each attempt)."""
    if current.terminal or current == TrainingState.QUEUED:
        return Decision()
    if stop_requested:
        if all(obs.ended for obs in learners):
            return Decision(TrainingState.HALTED, "stopped by the user", (Action.FINALIZE,))
        return Decision(actions=(Action.STOP,))

    primary_ids = set(primaries)
    # Exit 0 (COMPLETED) is never a failure, whichever learner it is and whenever.
    failed = [obs for obs in learners if obs.phase in ("FAILED", "LOST", "HALTED")]
    if failed:
        cause = retry_cause(failed, retries, attempt)
        if cause is not None and retries is not None:
            return Decision(
                message=retrying_message(attempt, retries, _failure(cause)),
                actions=(Action.RETRY,),
            )
        return Decision(
            TrainingState.FAILED,
            final_message(attempt, retries, _failure(failed[0])),
            (Action.FINALIZE,),
        )

    if learners and all(
        obs.phase == "COMPLETED" for obs in learners if obs.learner_id in primary_ids
    ):
        return Decision(TrainingState.COMPLETED, None, (Action.FINALIZE,))

    if max_runtime is not None and started_at is not None:
        elapsed = (now - started_at).total_seconds()
        if elapsed > max_runtime:
            return Decision(
                TrainingState.FAILED,
                final_message(
                    attempt,
                    retries,
                    f"timeout: the training ran longer than max_runtime ({max_runtime} s)",
                ),
                (Action.FINALIZE,),
            )

    # Progress: the least advanced learner still on its way (finished primaries are past
    # every phase; secondaries count until they run).
    phases = [
        _ORDER[obs.phase]
        for obs in learners
        if obs.phase in _ORDER
        and not (obs.learner_id not in primary_ids and obs.phase == "STORING")
    ]
    if not phases:
        return Decision()
    target = min(phases, key=_PROGRESS.index)
    if current in _PROGRESS and _PROGRESS.index(target) > _PROGRESS.index(current):
        return Decision(target)
    return Decision()


def passed_through(
    current: TrainingState, target: TrainingState, learners: Sequence[LearnerObservation]
) -> list[tuple[TrainingState, float]]:
    """The progression states between `current` and `target` that the training went
    through unseen (a learner ran and ended between two polls), each with the time the
    first learner entered it, so the history stays complete and truthful."""
    if target not in _PROGRESS and target != TrainingState.COMPLETED:
        return []
    order = [*_PROGRESS, TrainingState.COMPLETED]
    if current not in order:
        return []
    between = order[order.index(current) + 1 : order.index(target)]
    out = []
    for state in between:
        times = [at for obs in learners for phase, at in obs.phases if phase == state.value]
        if times:
            out.append((state, min(times)))
    return out
