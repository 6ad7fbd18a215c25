"""Accepting a training: `POST /v1/trainings` from the manifest and the archive to the
QUEUED row.

Two waits on servers make a submission: storing the code archive, and the database. They
overlap. A thread inspects the archive and stores it from the moment the request is read
(from the request's own copy of the upload: nothing is written to disk here), while the
request's own thread checks the manifest; the training is then
inserted with its plan's check in one statement (`service.db.repository.submitting`) while the
archive is still on its way, and committed once it is stored. A refused submission leaves
nothing behind: what was stored of it is removed whatever refused it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from sqlalchemy.orm import Session

from service.auth import TenantRef, new_id
from service.db.models import Learner, StatusEvent, Training, utcnow
from service.db.repository import PlanRoom, insert_within_plan
from service.domain import quotas
from service.domain.catalog import PlanSpec
from service.domain.manifest import Manifest, parse_manifest_text
from service.domain.manifest_formats import Submitted, load_submitted
from service.domain.runtimes import runtime_refusal
from service.domain.states import TrainingState
from service.errors import FieldError, LimitExceeded, ServiceUnavailable, ValidationFailed
from service.secrets import SecretBox, masked_document, seal_manifest
from service.storage import keys
from service.storage.archives import ArchiveSummary, UnsafeArchiveError, inspect_archive
from service.storage.base import ObjectStore, StoreUnavailable
from service.storage.endpoints import check_references

if TYPE_CHECKING:
    from service.platform import Platform

log = logging.getLogger(__name__)

# Threads storing submitted archives (each is waited for by its submission).
_ARCHIVES = ThreadPoolExecutor(16, thread_name_prefix="archive-upload")


@contextlib.contextmanager
def submission(
    session: Session,
    platform: Platform,
    tenant: TenantRef,
    manifest_text: str | bytes,
    archive: BinaryIO,
) -> Iterator[Training]:
    """Accept a training: the whole submission flow, around the caller's commit.

        with submissions.submission(session, platform, tenant, text, upload) as training:
            session.commit()

    Validates the manifest (the catalog, the tenant's plan, the data-store endpoints;
    ValidationFailed or BadRequest) while the code archive is spooled into the platform's
    upload directory, inspected (ValidationFailed naming `model_definition` if it is
    unsafe) and stored (ServiceUnavailable if the object store is unavailable). Inserts
    the training QUEUED, with the plan's default max_runtime if it names none, unless the
    tenant has as many trainings queued as the plan allows or the archive would take its
    stored bytes over the plan's (LimitExceeded); then yields the training, flushed, not
    committed, once its archive is stored.

    Services never commit, and this one does not either; but a submission is not
    complete until the commit is, and a refused one must leave nothing behind, so the
    caller commits inside the block: if the block raises (the commit failed), the stored
    archive is removed again and the error goes on. Once the block is through, the spooled
    upload is gone and the monitor is woken to admit the training.
    """
    training_id = new_id()
    training: Training | None = None
    storing = _ArchiveUpload(platform, archive, training_id)
    try:
        submitted, plan = _checked(platform, tenant, manifest_text)
        summary = storing.inspected()
        training = _new_training(
            training_id, tenant, submitted, plan, summary, storing.size, platform.secrets
        )
        room = PlanRoom(plan.max_queued_trainings, plan.max_stored_bytes, storing.size)
        if (usage := insert_within_plan(session, training, room)) is not None:
            raise _limit(tenant.plan, plan, usage.queued, usage.stored, storing.size)
        storing.stored()
        yield training
    except BaseException:
        if training is not None and training in session:
            # Inserted but not committed: the rollback that follows must not find it as if
            # it had been loaded (it was made persistent, not flushed as new).
            session.expunge(training)
        storing.abandon()
        raise
    platform.wake_monitor_to_admit()


def _checked(
    platform: Platform, tenant: TenantRef, manifest_text: str | bytes
) -> tuple[Submitted, PlanSpec]:
    """The manifest as accepted (max_runtime as the plan gives it) and the tenant's plan;
    ValidationFailed naming the fields as the user wrote them if it is refused."""
    submitted = load_submitted(parse_manifest_text(manifest_text), platform.catalog, tenant.plan)
    plan = platform.catalog.plans[tenant.plan]  # load_submitted refused a plan not offered
    parsed = submitted.manifest.model_copy(
        update={"max_runtime": quotas.effective_max_runtime(plan, submitted.manifest.max_runtime)}
    )
    if refused := check_references(parsed, platform.endpoint_policy):
        raise ValidationFailed(submitted.as_written(refused))
    if missing := runtime_refusal(
        platform.catalog,
        parsed.framework.name,
        parsed.framework.version,
        _StartableRuntimes(platform),
    ):
        raise ValidationFailed(submitted.as_written([missing]))
    return dataclasses.replace(submitted, manifest=parsed), plan


def _limit(plan_name: str, plan: PlanSpec, queued: int, stored: int, adding: int) -> LimitExceeded:
    """Why the plan had no room, as the plan's limits say it."""
    reached = quotas.check_queued_trainings(plan_name, plan, queued) or quotas.check_stored_bytes(
        plan_name, plan, stored, adding
    )
    if reached is None:  # the statement and the domain disagree: a defect, not the user's
        raise RuntimeError(f"no room in plan {plan_name} with {queued} queued, {stored} stored")
    return LimitExceeded(reached.limit, reached.message)


def _new_training(
    training_id: str,
    tenant: TenantRef,
    submitted: Submitted,
    plan: PlanSpec,
    summary: ArchiveSummary,
    code_bytes: int,
    secrets: SecretBox | None,
) -> Training:
    """The QUEUED training, its learners and its first event, not yet in any session.

    The data-store credentials of the manifest are stored encrypted with `secrets`
    (required when the manifest has a data or results reference). The manifest as the user
    sent it is kept (credentials masked) as `submitted_manifest`, and what its translation
    chose said in the QUEUED event."""
    manifest: Manifest = submitted.manifest
    document = manifest.model_dump(mode="json", exclude_none=True, by_alias=True)
    if secrets is not None:
        document = seal_manifest(document, secrets)
    elif manifest.training_data_reference or manifest.training_results_reference:
        raise ValueError("a manifest with data-store credentials needs a SecretBox")
    now = utcnow()
    training = Training(
        id=training_id,
        tenant_id=tenant.id,
        name=manifest.name,
        description=manifest.description,
        status=TrainingState.QUEUED,
        status_message="waiting for capacity",
        framework_name=manifest.framework.name,
        framework_version=manifest.framework.version,
        compute_name=manifest.compute_configuration.name,
        nodes=manifest.nodes,
        manifest=document,
        submitted_manifest=masked_document(submitted.document),
        model_definition_key=keys.model_definition_key(training_id, summary.format),
        code_bytes=code_bytes,
        created_at=now,
        updated_at=now,
    )
    training.learners = [
        Learner(training_id=training_id, learner_id=i, status=TrainingState.QUEUED, updated_at=now)
        for i in range(1, manifest.nodes + 1)
    ]
    notes = None
    if submitted.notes:
        notes = f"translated from {submitted.format_name}: {'; '.join(submitted.notes)}"
    training.events = [
        StatusEvent(training_id=training_id, status=TrainingState.QUEUED, at=now, message=notes)
    ]
    return training


@dataclass(frozen=True)
class _StartableRuntimes:
    """The runtimes a training may name, asked one at a time (`Platform.runtime_startable`):
    listing every installed runtime cost a submission a scan of every definition."""

    platform: Platform

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.platform.runtime_startable(name)


class _ArchiveUpload:
    """The code archive on its way to the store, from the moment the request is read: one
    thread inspects it and stores it, unless the submission is abandoned before it is
    inspected. `archive`: the upload as the request holds it (seekable), read by this
    thread alone."""

    def __init__(self, platform: Platform, archive: BinaryIO, training_id: str) -> None:
        self._store: ObjectStore = platform.store
        self._limits = platform.archive_limits
        self._archive = archive
        self._training_id = training_id
        self._abandoned = threading.Event()
        self._putting = False  # the archive was (being) sent to the store
        self.size = 0
        self._inspected: Future[ArchiveSummary] = Future()
        self._stored: Future[None] = Future()
        self._done = _ARCHIVES.submit(self._run)

    def inspected(self) -> ArchiveSummary:
        """Once the archive is inspected: what it holds; ValidationFailed if it is unsafe."""
        try:
            return self._inspected.result()
        except UnsafeArchiveError as e:
            raise ValidationFailed([FieldError("model_definition", str(e))]) from e

    def stored(self) -> None:
        """Once the archive is stored; ServiceUnavailable if the store could not take it."""
        try:
            self._stored.result()
        except StoreUnavailable as e:
            raise ServiceUnavailable(f"the code archive cannot be stored: {e}") from e

    def abandon(self) -> None:
        """The submission was refused: store nothing more, and remove what was stored (once
        the thread is done with it, so nothing lands later). Where the store cannot be
        reached now, what it may hold is logged, and the refusal goes on as it was."""
        self._abandoned.set()
        self._done.result()
        if not self._putting:
            return  # nothing was sent to the store
        try:
            self._store.delete_prefix(keys.training_prefix(self._training_id))
        except StoreUnavailable as e:
            log.warning(
                "the code archive of refused submission %s may remain in the store: %s",
                self._training_id,
                e,
            )

    def _run(self) -> None:
        inspected, stored, archive = self._inspected, self._stored, self._archive
        try:
            self.size = archive.seek(0, io.SEEK_END)
            summary = inspect_archive(archive, self._limits)
        except BaseException as e:
            inspected.set_exception(e)
            stored.set_exception(e)
            return
        inspected.set_result(summary)
        if self._abandoned.is_set():
            stored.set_exception(RuntimeError("the submission was refused"))
            return
        self._putting = True
        try:
            archive.seek(0)
            key = keys.model_definition_key(self._training_id, summary.format)
            self._store.put_stream(key, archive, self.size)
        except BaseException as e:
            stored.set_exception(e)
            return
        stored.set_result(None)
