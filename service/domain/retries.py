"""When a failed training is started again (pure; the monitor applies it).

A manifest's `retry_policy` names the failures worth another attempt: a learner *lost*
(its process or pod gone without reporting an end, its command killed by SIGKILL as the
out-of-memory killer and a node's shutdown do, or the platform shut down under it) and
commands that exit with a listed code. Another attempt is the same training started
again, with the checkpoints the last attempt left in CHECKPOINT_DIR; there are at most
`max_retries` of them (the plan caps it). Any other failure, a timeout or a user's stop
ends the training as before.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # lifecycle decides with these rules
    from service.domain.lifecycle import LearnerObservation


@dataclass(frozen=True)
class Retries:
    max_retries: int = 0
    on_lost: bool = False
    on_exit_codes: frozenset[int] = frozenset()

    @classmethod
    def of(cls, policy: Mapping[str, Any] | None) -> Retries | None:
        """The manifest's retry_policy as stored (a validated manifest's JSON form)."""
        if not policy:
            return None
        return cls(
            max_retries=int(policy.get("max_retries", 0)),
            on_lost=bool(policy.get("retry_on_lost", False)),
            on_exit_codes=frozenset(int(c) for c in policy.get("retry_on_exit_codes", ())),
        )

    @property
    def attempts(self) -> int:
        return self.max_retries + 1

    def covers(self, obs: LearnerObservation) -> bool:
        """Whether the policy retries this learner's failure."""
        if lost(obs):
            return self.on_lost
        return obs.phase == "FAILED" and obs.exit_code in self.on_exit_codes

    def covers_shutdown(self, attempt: int) -> bool:
        """Whether a training the platform's shutdown interrupted in `attempt` resumes."""
        return self.on_lost and attempt <= self.max_retries


# How a command killed by SIGKILL ends: the signal itself (-9), or 128 + 9 as a shell or
# the sandbox's init reports its child's death by the signal.
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)


def lost(obs: LearnerObservation) -> bool:
    """A learner gone without a say in it: vanished, or killed by SIGKILL."""
    return obs.phase == "LOST" or (obs.phase == "FAILED" and obs.exit_code in KILLED)


def retry_cause(
    failed: Sequence[LearnerObservation], retries: Retries | None, attempt: int
) -> LearnerObservation | None:
    """The failed learner whose failure starts another attempt, if any does and attempts
    are left (one failure often brings down the others: any covered one counts)."""
    if retries is None or attempt > retries.max_retries:
        return None
    return next((obs for obs in failed if retries.covers(obs)), None)


def retrying_message(attempt: int, retries: Retries, reason: str) -> str:
    return (
        f"attempt {attempt} of {retries.attempts} failed: {reason}; starting attempt "
        f"{attempt + 1} from its checkpoints"
    )


def final_message(attempt: int, retries: Retries | None, reason: str) -> str:
    """The message of the failure that ends a training: it names the attempt when the
    training may have more than one."""
    if retries is None or retries.max_retries == 0:
        return reason if attempt == 1 else f"attempt {attempt}: {reason}"
    left = (
        "no retries left" if attempt > retries.max_retries else "its retry_policy does not retry it"
    )
    return f"attempt {attempt} of {retries.attempts}: {reason} ({left})"
