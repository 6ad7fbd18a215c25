"""What the worker's tasks do: start learners, stop them, wrap a training up.

Each function loads the training by id and is idempotent: a task delivered twice, or
after a worker restart, does no harm.
"""

from __future__ import annotations

import io
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service import runtimes
from service.db import repository
from service.db.models import Training
from service.domain import quotas
from service.domain.lifecycle import LearnerObservation
from service.domain.manifest import (
    log_metric_definitions,
    parameter_server_count,
    tensorboard_metrics,
)
from service.domain.records import Secret
from service.domain.reports import Report
from service.domain.retries import Retries, final_message
from service.domain.runtimes import install_command
from service.domain.states import TrainingState
from service.logs import LogRecord, all_records
from service.platform import Platform
from service.secrets import SecretBox, SecretsUnreadable, open_reference
from service.storage import keys
from service.storage.base import StoreUnavailable
from service.storage.config import BucketLocation, StoreConfig
from service.storage.endpoints import EndpointPolicy
from service.tenants import LOCAL_TENANT
from service.trainings import (
    halt_remaining_learners,
    record_stopped_in_past_attempt,
    record_stopped_learners,
    record_transition,
)
from worker.backends.base import Backend, Observation, StartRequest, check_observation
from worker.installs import runtime_ready
from worker.launchers.plan import DLAAS_CONVENTIONS, TrainingSpec

log = logging.getLogger("dlaas.worker")


def training_spec(training: Training, platform: Platform) -> TrainingSpec:
    framework = training.manifest["framework"]
    nodes = training.nodes
    fw = platform.catalog.frameworks.get(training.framework_name)
    distribution = fw.distribution if fw else "parameter_server"
    compute = platform.catalog.compute_configurations.get(training.compute_name)
    return TrainingSpec(
        training_id=training.id,
        framework=training.framework_name,
        version=training.framework_version,
        command=framework["command"],
        nodes=nodes,
        parameter_servers=parameter_server_count(
            distribution, nodes, framework.get("parameter_servers")
        ),
        gpus_per_node=compute.gpus if compute else 0,
        distribution=distribution,
        cpus=compute.cpus if compute else 0,
        memory_gib=compute.memory_gib if compute else 0,
        conventions=training.manifest.get("conventions") or DLAAS_CONVENTIONS,
    )


def _bucket(
    ref: dict[str, Any], box: SecretBox, policy: EndpointPolicy, where: str, prefix: str
) -> BucketLocation:
    ref = open_reference(ref, box)
    connection = ref["connection"]
    store = StoreConfig(
        kind="s3",
        endpoint=connection["endpoint_url"],
        access_key=Secret.of(connection["access_key_id"]),
        secret_key=Secret.of(connection["secret_access_key"]),
        bucket=ref[where]["bucket"],
        region=connection.get("region"),
        # The learner checks the endpoint again when it connects (service.storage.endpoints);
        # an endpoint no entry allows any more gets none, and is refused there.
        allowed_endpoints=policy.entries_for(connection["endpoint_url"]),
    )
    return BucketLocation(store=store, prefix=prefix)


def user_buckets(
    training: Training, box: SecretBox, policy: EndpointPolicy
) -> tuple[BucketLocation | None, BucketLocation | None]:
    """The manifest's data and results buckets, credentials decrypted (SecretsUnreadable
    if they cannot be), each with the entries of `policy` that allow its endpoint."""
    data = training.manifest.get("training_data_reference")
    results = training.manifest.get("training_results_reference")
    results_prefix = keys.user_results_prefix(training.id)
    return (
        _bucket(data, box, policy, "source", data["source"].get("prefix", "")) if data else None,
        _bucket(results, box, policy, "target", results_prefix) if results else None,
    )


def unsandboxed_refusal(
    platform: Platform, backend: Backend, session: Session, training: Training
) -> str | None:
    """Why the training may not start, if its learners would run without a sandbox: only
    the local tenant's may, unless the operator allows it (DLAAS_ALLOW_UNSANDBOXED)."""
    why = backend.unsandboxed_reason()
    if why is None or platform.settings.allow_unsandboxed:
        return None
    if repository.tenant_name_of(session, training.tenant_id) == LOCAL_TENANT:
        return None
    return (
        f"the learners could not be started: no sandbox can be made on this platform ({why}), "
        "and only the local tenant's trainings run without one; an operator of a one-user "
        "machine can set DLAAS_ALLOW_UNSANDBOXED=true"
    )


def launch(platform: Platform, backend: Backend, training_id: str) -> None:
    if not runtime_ready(platform, training_id):
        return  # its runtime is being installed; launched again when it is
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        if training is None or training.status != TrainingState.PENDING:
            return
        if training.stop_requested_at is not None:
            return
        refusal = unsandboxed_refusal(platform, backend, session, training)
        if refusal is not None:
            record_transition(training, TrainingState.FAILED, refusal)
            session.commit()
            return
        try:
            training_data, results_target = user_buckets(
                training, platform.secrets, platform.endpoint_policy
            )
        except SecretsUnreadable as e:
            record_transition(
                training, TrainingState.FAILED, f"the learners could not be started: {e}"
            )
            session.commit()
            return
        runtime_name = platform.catalog.runtime(training.framework_name, training.framework_version)
        runtime = None if runtime_name == runtimes.PLATFORM else platform.runtime(runtime_name)
        if runtime_name != runtimes.PLATFORM and runtime is None:
            record_transition(
                training,
                TrainingState.FAILED,
                f"the learners could not be started: the runtime '{runtime_name}' is not "
                f"installed where they run (`{install_command(runtime_name)}`)",
            )
            session.commit()
            return
        plan_name = repository.plans_of_tenants(session, [training.tenant_id]).get(
            training.tenant_id
        )
        plan = platform.catalog.plans.get(plan_name) if plan_name else None
        attempt, attempt_message = training.attempt, training.status_message
        restore = None
        if attempt > 1:
            try:
                restore = end_previous_attempt(platform, backend, training)
            except StoreUnavailable as e:
                record_transition(
                    training,
                    TrainingState.FAILED,
                    final_message(
                        attempt,
                        Retries.of(training.manifest.get("retry_policy")),
                        f"the checkpoints of attempt {attempt - 1} could not be saved: {e}",
                    ),
                )
                session.commit()
                unsaved = True
            else:
                session.commit()
                unsaved = False
            if unsaved:  # what is left of the last attempt is released as for any end
                finalize_quietly(platform, backend, training_id)
                return
        request = StartRequest(
            spec=training_spec(training, platform),
            model_definition_key=training.model_definition_key,
            store=platform.learner_store,
            log_sink=platform.log_sink,
            results_prefix=keys.results_prefix(training_id),
            training_data=training_data,
            results_target=results_target,
            max_log_bytes=quotas.learner_log_cap(plan, training.nodes) if plan else None,
            attempt=attempt,
            restore_checkpoints=restore,
            runtime=runtime,
            tenant=training.tenant_id,
            compute=platform.catalog.compute_configurations.get(training.compute_name),
            max_runtime=training.manifest.get("max_runtime"),
            log_dir_sync_seconds=platform.settings.log_dir_sync_seconds,
            tensorboard_metrics=tensorboard_metrics(training.manifest),
            log_metrics=tuple(log_metric_definitions(training.manifest)),
        )
        learner_ids = [lr.learner_id for lr in training.learners]
    if attempt > 1 and backend.observe(training_id) is None:
        # Where one attempt's output ends and the next one's begins, in every learner's log.
        marker = f"[dlaas] {attempt_message or f'attempt {attempt}'}"
        platform.logs.append(training_id, [LogRecord(i, time.time(), marker) for i in learner_ids])
    try:
        backend.start(request)
    except Exception as e:
        log.exception("starting the learners of %s failed", training_id)
        backend.cleanup(training_id)
        with platform.sessions() as session:
            training = repository.training_by_id(session, training_id)
            if training is not None and not TrainingState(training.status).terminal:
                record_transition(
                    training, TrainingState.FAILED, f"the learners could not be started: {e}"
                )
                session.commit()
        return
    # The training may have been stopped while its learners were starting.
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        gone = training is None or TrainingState(training.status).terminal
    if gone:
        backend.cleanup(training_id)


def end_previous_attempt(platform: Platform, backend: Backend, training: Training) -> str | None:
    """Before `training.attempt` starts: stop what is left of the attempt before it, save
    its CHECKPOINT_DIR and release it; returns where the latest saved checkpoints are (to
    restore), or None if no attempt saved any. Raises StoreUnavailable if they cannot be
    saved (the old attempt is kept then)."""
    previous = backend.observe(training.id)
    if previous is not None and previous.attempt < training.attempt:
        backend.stop(training.id)
        stopped = _checked(training, backend.observe(training.id))
        if stopped is not None:
            record_stopped_in_past_attempt(training, stopped)
        save_checkpoints(platform, backend, training, previous.attempt)
        backend.cleanup(training.id)
    latest = _saved_attempts(platform, training.id)
    return keys.attempt_checkpoints_prefix(training.id, max(latest)) if latest else None


def _saved_attempts(platform: Platform, training_id: str) -> set[int]:
    found = (
        keys.checkpoint_attempt(training_id, info.key)
        for info in platform.store.list(keys.checkpoints_prefix(training_id))
    )
    return {n for n in found if n is not None}


def save_checkpoints(
    platform: Platform, backend: Backend, training: Training, attempt: int
) -> None:
    """Save the stopped learners' CHECKPOINT_DIR as `attempt` left it, keep only that
    one, and count its bytes in the training's stored bytes."""
    saved = backend.save_checkpoints(
        training.id, platform.store, keys.attempt_checkpoints_prefix(training.id, attempt)
    )
    if saved is None:
        return
    for older in _saved_attempts(platform, training.id) - {attempt}:
        platform.store.delete_prefix(keys.attempt_checkpoints_prefix(training.id, older))
    training.checkpoint_bytes = saved


def _checked(
    training: Training, observation: Observation | None
) -> tuple[LearnerObservation, ...] | None:
    """What stopped learners reported, checked as the monitor checks it (they run the
    user's code); None if there is nothing, or nothing acceptable."""
    if not isinstance(observation, Observation):
        return None
    report = check_observation(
        observation,
        [lr.learner_id for lr in training.learners],
        window=(float("-inf"), float("inf")),
    )
    return tuple(report.learners) if isinstance(report, Report) else None


def finalize_quietly(platform: Platform, backend: Backend, training_id: str) -> None:
    try:
        finalize(platform, backend, training_id)
    except Exception:  # the store is down: the learners are stopped, the rest can wait
        log.exception("wrapping up %s failed", training_id)
        backend.cleanup(training_id)


def stop(backend: Backend, training_id: str) -> None:
    backend.stop(training_id)


def finalize(platform: Platform, backend: Backend, training_id: str) -> None:
    """Stop what is left (parameter servers, MPI hosts) and record how each of them ended,
    archive every learner's log to the object store if its wrapper could not, and release
    the training's resources."""
    backend.stop(training_id)
    # What the stopped learners reported as they ended (exit code or signal), read before
    # cleanup removes it, so that the record matches what happened to them.
    try:
        observation = backend.observe(training_id)
    except Exception:  # the learners stay recorded HALTED, without an exit code
        log.exception("observing the stopped learners of %s failed", training_id)
        observation = None
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        if training is not None and TrainingState(training.status).terminal:
            try:
                save_checkpoints(platform, backend, training, training.attempt)
                session.commit()
            except Exception:  # the results matter more: the training ends all the same
                log.exception("saving the checkpoints of %s failed", training_id)
                session.rollback()
    backend.cleanup(training_id)
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        if training is None:
            return
        attempts = training.attempt
        if TrainingState(training.status).terminal:
            halt_remaining_learners(training)
            stopped = _checked(training, observation)
            if stopped is not None:
                record_stopped_learners(training, stopped)
            session.commit()
        learners = [lr.learner_id for lr in training.learners]
    # The last attempt's wrappers stored their own output; every attempt's is in the log.
    archive_logs(platform, training_id, learners, every=attempts > 1)
    record_results_bytes(platform, training_id)


def record_results_bytes(platform: Platform, training_id: str) -> None:
    """Record the bytes of the training's stored results (what the plan's
    max_stored_bytes counts, with its code archive)."""
    size = sum(o.size for o in platform.store.list(keys.results_prefix(training_id)))
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        if training is not None:
            training.results_bytes = size
            session.commit()


def archive_logs(
    platform: Platform, training_id: str, learners: list[int], *, every: bool = False
) -> None:
    """Write each learner's training-log.txt from the log store where its wrapper did
    not store one (or, with `every`, for every learner: a retried training's log has
    every attempt's output)."""
    prefix = keys.results_prefix(training_id)
    missing = {
        i for i in learners if every or platform.store.stat(keys.learner_log_key(prefix, i)) is None
    }
    if not missing:
        return
    lines: dict[int, io.StringIO] = {i: io.StringIO() for i in missing}
    for record in all_records(platform.logs, training_id):
        if record.learner in lines:
            lines[record.learner].write(record.render() + "\n")
    for i, buf in lines.items():
        with tempfile.NamedTemporaryFile("w", delete=False, suffix=".txt") as tmp:
            tmp.write(buf.getvalue())
        try:
            platform.store.put_file(keys.learner_log_key(prefix, i), Path(tmp.name))
        finally:
            Path(tmp.name).unlink(missing_ok=True)
