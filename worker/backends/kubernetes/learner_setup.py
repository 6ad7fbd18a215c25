"""What a training's objects are made from: the learners' specs, the store as they reach it
(credentials scoped to the training where a role can be assumed), the MPI key pair. Used
by the backend's start; it creates nothing in the cluster.
"""

from __future__ import annotations

import dataclasses
import logging

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service import runtimes
from service.domain.catalog import ComputeSpec
from service.logs.config import LogSinkConfig
from service.storage import keys, scoped
from service.storage.config import StoreConfig
from worker.backends.base import StartRequest, learner_spec
from worker.backends.kubernetes.objects import Owner, SshKeyPair, TrainingObjectsInput, learner_env
from worker.launchers.plan import LaunchPlan, LearnerPlan

log = logging.getLogger("worker.backends.kubernetes.backend")

# A training with no max_runtime (none is admitted without one) still gets a pod deadline.
DEFAULT_MAX_RUNTIME = 7 * 24 * 3600


def ssh_key_pair() -> SshKeyPair:
    """A fresh ed25519 key pair in OpenSSH format: one per training, for mpirun's ssh."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return SshKeyPair(private_key=private, public_key=public.decode() + " dlaas\n")


def training_scope(request: StartRequest) -> scoped.TrainingScope:
    """What a training's pods may touch in the platform's store: read its model
    definition and the checkpoints it restores; read and write its results, its metrics
    (`keys.metrics_prefix`: the TensorBoard and log metric documents its agents store) and
    this attempt's checkpoints."""
    training_id = request.spec.training_id
    return scoped.TrainingScope(
        training_id=training_id,
        read_keys=(request.model_definition_key,),
        read_prefixes=(request.restore_checkpoints,) if request.restore_checkpoints else (),
        write_prefixes=(
            request.results_prefix,
            keys.metrics_prefix(training_id),
            keys.attempt_checkpoints_prefix(training_id, request.attempt),
        ),
    )


@dataclasses.dataclass
class LearnerSetup:
    """The backend's settings for what its learners hold and how patiently they store."""

    stop_grace_seconds: float
    store_attempts: int
    store_retry_seconds: float
    # Where the learners' store credentials come from (see learner_store).
    store_role_arn: str | None
    store_session_max_seconds: int
    _told_unscoped: bool = False

    def objects_input(
        self,
        request: StartRequest,
        plan: LaunchPlan,
        owner: Owner,
        ssh: SshKeyPair | None,
        log_sink: LogSinkConfig,
    ) -> TrainingObjectsInput:
        spec = request.spec
        store = self.learner_store(request)
        compute = request.compute or ComputeSpec(
            gpus=spec.gpus_per_node, cpus=max(spec.cpus, 1), memory_gib=max(spec.memory_gib, 1)
        )
        return TrainingObjectsInput(
            training_id=spec.training_id,
            tenant=request.tenant,
            plan=plan,
            learner_specs={
                lp.learner_id: self.learner_spec(request, lp, store, log_sink)
                for lp in plan.learners
            },
            runtime=request.runtime.name if request.runtime else runtimes.PLATFORM,
            compute=compute,
            max_runtime=request.max_runtime or DEFAULT_MAX_RUNTIME,
            distribution=spec.distribution,
            owner=owner,
            attempt=request.attempt,
            ssh=ssh,
            stop_grace_seconds=max(1, round(self.stop_grace_seconds)),
            runtime_prefix=(
                request.runtime.prefix
                if request.runtime and request.runtime.name != runtimes.PLATFORM
                else None
            ),
        )

    def learner_store(self, request: StartRequest) -> StoreConfig:
        """The store as the training's learners reach it: with temporary credentials that
        reach only the training's own keys (service.storage.scoped) where
        DLAAS_STORE_ROLE_ARN names a role and the store is S3; else the platform's own
        credentials, which reach the whole bucket (said once, for the operator)."""
        store = request.store
        if self.store_role_arn is None or store.kind != "s3":
            if not self._told_unscoped:
                self._told_unscoped = True
                why = "DLAAS_STORE_ROLE_ARN is not set" if store.kind == "s3" else "it is local"
                log.warning(
                    "learner pods get the platform's store credentials, not scoped to their "
                    "training (%s): a learner's pod can read and write the whole store",
                    why,
                )
            return store
        scope = training_scope(request)
        duration = scoped.session_seconds(
            request.max_runtime or DEFAULT_MAX_RUNTIME, self.store_session_max_seconds
        )
        return scoped.scoped_store(store, self.store_role_arn, scope, duration)

    def learner_spec(
        self, request: StartRequest, lp: LearnerPlan, store: StoreConfig, log_sink: LogSinkConfig
    ) -> str:
        request = dataclasses.replace(request, log_sink=log_sink)
        return learner_spec(
            request,
            lp,
            learner_env(lp, request.spec.conventions),
            store=store,
            stop_grace_seconds=self.stop_grace_seconds,
            store_attempts=self.store_attempts,
            store_retry_seconds=self.store_retry_seconds,
            checkpoints_prefix=keys.learner_checkpoints_prefix(
                keys.attempt_checkpoints_prefix(request.spec.training_id, request.attempt),
                lp.learner_id,
            ),
            restore_checkpoints=request.restore_checkpoints,
        ).to_json()
