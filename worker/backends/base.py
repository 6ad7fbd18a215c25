"""The one interface to wherever learners run (local processes, Kubernetes pods).

Every call is idempotent and keyed by training id, so a restarted worker or monitor
reconciles from what the backend reports instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from service.domain.admission import Candidate, Fit
from service.domain.catalog import ComputeSpec
from service.domain.gang_release import Unschedulable
from service.domain.lifecycle import LearnerObservation
from service.domain.reports import Malformed, Report, check_report
from service.logs.config import LogSinkConfig
from service.runtimes import RuntimeInfo
from service.storage.base import ObjectStore
from service.storage.config import BucketLocation, StoreConfig
from worker.launchers.plan import LearnerPlan, TrainingSpec
from worker.learner.spec import LearnerSpec


@dataclass(frozen=True)
class StartRequest:
    """Everything a backend needs to start the learners of a training."""

    spec: TrainingSpec
    model_definition_key: str
    store: StoreConfig
    log_sink: LogSinkConfig
    results_prefix: str
    # The user's data bucket (fetched into DATA_DIR) and results bucket (copied to), with
    # credentials in clear: backends hand them to learners privately, never in argv or env.
    training_data: BucketLocation | None = None
    results_target: BucketLocation | None = None
    # Log bytes each learner may write (its share of the plan's); None: unbounded.
    max_log_bytes: int | None = None
    # Which attempt of the training this is (1, then one more per retry), and where the
    # last attempt's CHECKPOINT_DIR was saved, to restore before the learners start.
    attempt: int = 1
    restore_checkpoints: str | None = None
    # The runtime the user's command runs in (the catalog's for its framework version);
    # None: the platform's own Python.
    runtime: RuntimeInfo | None = None
    # Who the training is of, its compute configuration (resources, and on Kubernetes its
    # node labels and tolerations) and its max_runtime in seconds: what a cluster's
    # objects carry. None: the spec's resources, no deadline of the backend's own.
    tenant: str = ""
    compute: ComputeSpec | None = None
    max_runtime: int | None = None
    # How often learners sync LOG_DIR while they run (DLAAS_LOG_DIR_SYNC_SECONDS), and
    # whether they read their TensorBoard event files' scalars as the training's metrics.
    log_dir_sync_seconds: float = 10.0
    tensorboard_metrics: bool = False
    # The manifest's metric regexes, (name, regex) each, which learners apply to their
    # output as they log it (LearnerSpec.log_metrics).
    log_metrics: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Observation:
    learners: tuple[LearnerObservation, ...]
    primaries: tuple[int, ...]
    notes: tuple[str, ...] = field(default=())
    # The attempt these learners were started for (StartRequest.attempt).
    attempt: int = 1
    # The learners whose pods the cluster's scheduler could not place, and since when
    # (service.domain.gang_release); a backend without a scheduler reports none.
    unschedulable: tuple[Unschedulable, ...] = ()


def check_observation(
    observation: Observation, learner_ids: Collection[int], window: tuple[float, float]
) -> Report | Malformed:
    """A backend's observation checked as the untrusted report it is (learners run the
    user's code; service.domain.reports), for a training of `learner_ids` whose learners'
    phase times must fall in `window`."""
    return check_report(
        observation.learners,
        observation.primaries,
        observation.notes,
        learner_ids=learner_ids,
        window=window,
    )


class CapacityFit(Fit, Protocol):
    """What fits a backend now, for one admission pass."""

    def never(self, candidate: Candidate) -> str | None:
        """Why the training can never fit this backend (it is failed, saying so), or None."""
        ...


@runtime_checkable
class FitsCapacity(Protocol):
    """A backend that knows what fits it now (its nodes' free resources); one without
    this admits by its slots()."""

    def fit(
        self, starting: Sequence[Candidate], computes: Mapping[str, ComputeSpec]
    ) -> CapacityFit | None:
        """What fits now, given the `starting` trainings (admitted, their learners perhaps
        not placed yet: PENDING, DOWNLOADING) and the compute configurations offered;
        None: the slots decide this pass."""
        ...


class Backend(Protocol):
    def start(self, request: StartRequest) -> None:
        """Start every learner of the training (all or none); a second call is a no-op."""
        ...

    def observe(self, training_id: str) -> Observation | None:
        """What the learners are doing, or None if this backend never started them."""
        ...

    def stop(self, training_id: str) -> None:
        """SIGTERM (or pod deletion), then SIGKILL after the grace period; returns when
        no learner process is left."""
        ...

    def cleanup(self, training_id: str) -> None:
        """Release everything the training held (processes, networks, scratch space)."""
        ...

    def held(self) -> list[str]:
        """The trainings this backend holds anything for (learners, scratch space): the
        monitor has those that ended released again, if the FINALIZE that should have
        released them was lost (a worker killed while it ran)."""
        ...

    def save_checkpoints(self, training_id: str, store: ObjectStore, prefix: str) -> int | None:
        """Copy the training's CHECKPOINT_DIR (its stopped learners') to `prefix` in
        `store`, replacing what was there; the bytes saved, or None if this backend holds
        nothing for the training. Only regular files; links and anything else the user's
        code left there are skipped."""
        ...

    def unsandboxed_reason(self) -> str | None:
        """None when the learners' commands run in a sandbox (a local sandbox, a pod);
        else why they cannot, for the operator and the training's status."""
        ...

    def slots(self) -> int:
        """How many learners this backend can run at once."""
        ...

    def changed(self) -> set[str] | None:
        """The trainings whose observation may have changed since the last call (the
        monitor then reconciles only those, and every training in its full passes); None
        when the backend cannot tell, and the monitor reconciles every active training."""
        ...

    def changes(self, wake: Callable[[], None]) -> AbstractContextManager[None]:
        """While in the block, call `wake` soon after a learner's state changes (a phase,
        an exit), so the monitor need not poll fast to notice. Best effort: the monitor
        still polls, and a backend that cannot tell may never call it."""
        ...


def learner_spec(
    request: StartRequest,
    lp: LearnerPlan,
    env: dict[str, str],
    *,
    store: StoreConfig,
    stop_grace_seconds: float,
    store_attempts: int,
    store_retry_seconds: float,
    checkpoints_prefix: str | None = None,
    restore_checkpoints: str | None = None,
) -> LearnerSpec:
    """Learner `lp`'s part of the learner contract, as every backend writes it: the plan's
    command and `env` (whose directory variables name where it runs), what to fetch and
    where to store. `store` is the store the learner reaches (the request's, or one with
    credentials scoped to the training)."""
    return LearnerSpec(
        training_id=request.spec.training_id,
        learner_id=lp.learner_id,
        num_learners=request.spec.nodes,
        hostname=lp.hostname,
        argv=list(lp.argv),
        env=env,
        model_dir=env["MODEL_DIR"],
        data_dir=env["DATA_DIR"],
        result_dir=env["RESULT_DIR"],
        log_dir=env["LOG_DIR"],
        checkpoint_dir=env["CHECKPOINT_DIR"],
        model_definition_key=request.model_definition_key,
        store=store,
        log_sink=request.log_sink,
        results_prefix=request.results_prefix,
        upload_results=lp.primary,
        training_data=request.training_data,
        results_target=request.results_target,
        waits_for_peers=lp.waits_for_peers,
        stop_grace_seconds=stop_grace_seconds,
        max_log_bytes=request.max_log_bytes,
        store_attempts=store_attempts,
        store_retry_seconds=store_retry_seconds,
        checkpoints_prefix=checkpoints_prefix,
        restore_checkpoints=restore_checkpoints,
        log_dir_sync_seconds=request.log_dir_sync_seconds,
        tensorboard_metrics=request.tensorboard_metrics,
        log_metrics=request.log_metrics,
    )
