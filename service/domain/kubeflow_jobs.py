"""Kubeflow `TFJob` (kubeflow.org/v1) and `MPIJob` (kubeflow.org/v2beta1) files as
training manifests (pure).

`translate_kubeflow_job` turns the object a user would `kubectl apply` into the
platform's own manifest: replica counts become `compute_configuration.nodes` (and a
TFJob's PS replicas `framework.parameter_servers`), the container's command and args the
command, `resources.limits` the smallest compute configuration that holds them
(service.domain.resources), `runPolicy.activeDeadlineSeconds` `max_runtime`,
`runPolicy.backoffLimit` `retry_policy`, and the image the framework and version of the
runtime it names (service.domain.kubeflow_pods). What cannot be carried is refused naming
the field, as a JSON pointer into the file as sent; service.domain.manifest_formats then
checks the manifest as any other, its refusals named at the job's own fields too
(`Translation.written_as`).

Why a schema of our own rather than the Kubeflow SDK's models: the maintained package
(`kubeflow-training`) has TFJob models but only v1 MPIJob ones (v2beta1 MPIJob models are
published by no maintained package); its models import the Kubernetes client (which
`service.domain` may not import) and pin it below the version the platform's Kubernetes
backend uses; and its deserializer drops fields it does not know, where a field this
platform cannot carry must be refused, never dropped. So each level of the object is read
here against the fields the Kubeflow CRDs define, each carried, checked or refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.domain.catalog import Catalog
from service.domain.kubeflow_pods import (
    Container,
    Refusals,
    Resources,
    check_keys,
    child,
    image_runtime,
    mapping_at,
    read_container,
    shell_line,
)
from service.domain.mpirun_line import read_mpirun_line
from service.domain.resources import NoComputeConfiguration, smallest_compute
from service.errors import FieldError, ValidationFailed

TFJOB = ("kubeflow.org/v1", "TFJob")
MPIJOB = ("kubeflow.org/v2beta1", "MPIJob")
ACCEPTED = f"{TFJOB[0]} {TFJOB[1]}, {MPIJOB[0]} {MPIJOB[1]}"

_IGNORED_METADATA = (
    "namespace",  # a training lives in its tenant's space, whatever namespace is named
    "labels",
    "annotations",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
)
_RUN_POLICY_REASONS = {
    "schedulingPolicy": "the platform admits a training's learners all at once by its own "
    "queue and plans",
    "managedBy": "the platform runs the job itself",
}
# A replica restarted on every failure (kubelet's OnFailure, Always) has no counterpart:
# the platform starts a whole training again, from its checkpoints (retry_policy).
_RESTART_POLICIES = ("Never", "ExitCode")
# Kubeflow's ExitCode policy retries exit codes 128-255; a command's death by a signal
# (128 + 1..31) is what reaches them. (The platform lists at most 32 codes.)
SIGNAL_EXIT_CODES = tuple(range(129, 160))


def is_kubernetes_object(data: Mapping[str, Any]) -> bool:
    """Whether a submitted document is a Kubernetes object (it names apiVersion or kind),
    which the platform's manifest never does."""
    return "apiVersion" in data or "kind" in data


@dataclass(frozen=True)
class Translation:
    """The platform's manifest of a job, where each of its fields came from, and what the
    translation chose that the job does not say, in words."""

    manifest: dict[str, Any]
    # A pointer into the manifest -> the pointer into the job it came from (each leaf a
    # check of the manifest may name, as service.domain.manifest.as_written reads it).
    written_as: dict[str, str]
    notes: tuple[str, ...]


def translate_kubeflow_job(data: Mapping[str, Any], catalog: Catalog) -> Translation:
    """The platform's manifest of a TFJob or MPIJob; ValidationFailed naming each field of
    the job that cannot be carried."""
    kind = (data.get("apiVersion"), data.get("kind"))
    if kind not in (TFJOB, MPIJOB):
        field = "/kind" if data.get("kind") not in (TFJOB[1], MPIJOB[1]) else "/apiVersion"
        raise ValidationFailed(
            [
                FieldError(
                    field,
                    f"{data.get('apiVersion')} {data.get('kind')} is not a job the platform "
                    f"takes; accepted: {ACCEPTED}, or the platform's own manifest",
                )
            ]
        )
    refusals = Refusals()
    job = _Job(data, catalog, refusals)
    translation = job.tfjob() if kind == TFJOB else job.mpijob()
    if refusals or translation is None:
        raise ValidationFailed(list(dict.fromkeys(refusals)))  # each refusal once
    return translation


class _Job:
    """One job being read; its refusals collected, not raised one at a time."""

    def __init__(self, data: Mapping[str, Any], catalog: Catalog, refusals: Refusals):
        self.data = data
        self.catalog = catalog
        self.refusals = refusals
        self.resources = Resources()
        check_keys(
            data,
            "",
            refusals,
            carried=("apiVersion", "kind", "metadata", "spec"),
            ignored=("status",),
        )
        self.spec = mapping_at(data.get("spec"), "/spec", refusals)
        if "spec" not in data:
            refusals.add("/spec", "is required")
        self.written_as: dict[str, str] = {"/name": "/metadata/name"}
        self.notes: list[str] = []

    # -- shared by both kinds -----------------------------------------------------------

    def name(self) -> str:
        metadata = mapping_at(self.data.get("metadata"), "/metadata", self.refusals)
        check_keys(
            metadata,
            "/metadata",
            self.refusals,
            carried=("name", "generateName"),
            ignored=_IGNORED_METADATA,
        )
        name = metadata.get("name") or metadata.get("generateName")
        if not isinstance(name, str) or not name.strip("-"):
            self.refusals.add("/metadata/name", "is required")
            return ""
        if "name" not in metadata:
            self.written_as["/name"] = "/metadata/generateName"
        return name.strip("-")

    def run_policy(self, manifest: dict[str, Any], restart: set[str]) -> None:
        """max_runtime and retry_policy from runPolicy (and the replicas' restartPolicy)."""
        at = "/spec/runPolicy"
        policy = mapping_at(self.spec.get("runPolicy"), at, self.refusals)
        check_keys(
            policy,
            at,
            self.refusals,
            carried=("activeDeadlineSeconds", "backoffLimit", "suspend"),
            ignored=("cleanPodPolicy", "ttlSecondsAfterFinished"),
            reasons=_RUN_POLICY_REASONS,
        )
        if policy.get("suspend") is True:
            self.refusals.add(
                child(at, "suspend"), "is not supported: a training starts when it is admitted"
            )
        deadline = policy.get("activeDeadlineSeconds")
        if deadline is not None:
            manifest["max_runtime"] = deadline
            self.written_as["/max_runtime"] = child(at, "activeDeadlineSeconds")
        backoff = policy.get("backoffLimit")
        if backoff is not None and backoff != 0:  # 0: no retry, as no retry_policy
            retry: dict[str, Any] = {"max_retries": backoff, "retry_on_lost": True}
            if "ExitCode" in restart:
                retry["retry_on_exit_codes"] = list(SIGNAL_EXIT_CODES)
            manifest["retry_policy"] = retry
            for field in ("", "/max_retries", "/retry_on_exit_codes"):
                self.written_as[f"/retry_policy{field}"] = child(at, "backoffLimit")

    def replicas(self, specs: Mapping[str, Any], at: str, kind: str, default: int) -> int:
        replica = mapping_at(specs.get(kind), child(at, kind), self.refusals)
        count = replica.get("replicas", default if kind in specs else 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            self.refusals.add(child(child(at, kind), "replicas"), "must be a whole number >= 0")
            return 0
        return count

    def restart_policy(self, replica: Mapping[str, Any], at: str, restart: set[str]) -> None:
        policy = replica.get("restartPolicy")
        if policy is None:
            return
        if policy not in _RESTART_POLICIES:
            self.refusals.add(
                child(at, "restartPolicy"),
                f"'{policy}' is not supported: the platform restarts a whole training (from "
                "its checkpoints) when a learner is lost or, with ExitCode, killed by a "
                "signal, up to runPolicy.backoffLimit times; use Never or ExitCode",
            )
        restart.add(str(policy))

    def containers(
        self, specs: Mapping[str, Any], at: str, kinds: list[str], restart: set[str]
    ) -> dict[str, Container]:
        read: dict[str, Container] = {}
        for kind in kinds:
            replica_at = child(at, kind)
            replica = mapping_at(specs.get(kind), replica_at, self.refusals)
            self.restart_policy(replica, replica_at, restart)
            container = read_container(replica, replica_at, self.refusals, self.resources)
            if container is not None:
                read[kind] = container
        return read

    def runtime(self, containers: dict[str, Container], distribution: str) -> tuple[str, str]:
        """The framework and version the images name: one image for every replica."""
        first_kind, first = next(iter(containers.items()))
        for container in containers.values():
            if container.image != first.image:
                self.refusals.add(
                    child(container.pointer, "image"),
                    f"is not supported: every learner runs one runtime, so every replica "
                    f"names one image ({first_kind}'s is '{first.image}')",
                )
        self.written_as["/framework/name"] = child(first.pointer, "image")
        self.written_as["/framework/version"] = child(first.pointer, "image")
        runtime = image_runtime(first.image, self.catalog, distribution)
        if isinstance(runtime, str):
            if first.image:
                self.refusals.add(child(first.pointer, "image"), runtime)
            return "", ""
        framework, version = runtime
        self.notes.append(
            f"image {first.image} runs as {framework} {version} (runtime "
            f"{self.catalog.runtime(framework, version)})"
        )
        return runtime

    def compute(self, nodes: int, nodes_at: str, fallback_at: str) -> str:
        r = self.resources
        try:
            name = smallest_compute(
                self.catalog,
                gpus=r.gpus,
                cpus=r.cpus,
                memory_bytes=r.memory_bytes,
                nodes=nodes,
            )
        except NoComputeConfiguration as e:
            names = {"gpus": "gpus", "cpus": "cpus", "memory": "memory_bytes"}
            where = [r.where[names[k]] for k in e.resources if names.get(k) in r.where]
            if not where and "nodes" in e.resources:
                where = [nodes_at]
            self.refusals.add(where[0] if where else fallback_at, e.message)
            return ""
        asked = [r.where[k] for k in ("gpus", "cpus", "memory_bytes") if k in r.where]
        self.written_as["/compute_configuration"] = asked[0] if asked else fallback_at
        self.written_as["/compute_configuration/name"] = asked[0] if asked else fallback_at
        self.written_as["/compute_configuration/nodes"] = nodes_at
        self.notes.append(
            f"compute configuration {name}: the smallest that holds {r.gpus} GPU(s), "
            f"{r.cpus:g} CPU(s) and {r.memory_bytes / 2**30:.3g} GiB per learner (the largest "
            f"replica's resources), on {nodes} node(s)"
        )
        return name

    def command_required(self, container: Container, why: str) -> tuple[str, ...] | None:
        if container.argv is None or not container.argv:
            self.refusals.add(
                container.command_at,
                f"is required: the platform runs its own runtimes, not an image's "
                f"entrypoint; {why}",
            )
            return None
        return container.argv

    # -- TFJob ---------------------------------------------------------------------------

    def tfjob(self) -> Translation | None:
        name = self.name()
        check_keys(
            self.spec,
            "/spec",
            self.refusals,
            carried=("tfReplicaSpecs", "runPolicy", "successPolicy", "enableDynamicWorker"),
        )
        if self.spec.get("successPolicy") not in (None, "", "AllWorkers"):
            self.refusals.add(
                "/spec/successPolicy",
                "is not supported: a training completes when every worker has exited 0 "
                "(AllWorkers)",
            )
        if self.spec.get("enableDynamicWorker") is True:
            self.refusals.add(
                "/spec/enableDynamicWorker",
                "is not supported: a training's learners are fixed when it starts",
            )
        at = "/spec/tfReplicaSpecs"
        specs = mapping_at(self.spec.get("tfReplicaSpecs"), at, self.refusals)
        if not specs:
            self.refusals.add(at, "is required: PS and Worker (or Chief) replicas")
            return None
        check_keys(
            specs,
            at,
            self.refusals,
            carried=("PS", "Worker", "Chief", "Master", "Evaluator"),
        )
        count = {k: self.replicas(specs, at, k, 1) for k in ("PS", "Worker", "Chief", "Master")}
        chief = "Chief" if count["Chief"] else "Master"
        if self.replicas(specs, at, "Evaluator", 1):
            self.refusals.add(
                child(at, "Evaluator"),
                "is not supported: the platform's TensorFlow learners are parameter servers "
                "and workers; evaluate in the workers (or a later training) instead",
            )
        if count[chief]:
            if count[chief] != 1:
                self.refusals.add(child(child(at, chief), "replicas"), "must be 1")
            if count["PS"] or count["Worker"]:
                self.refusals.add(
                    child(at, chief),
                    "is not supported beside PS or Worker replicas: the platform's TensorFlow "
                    "cluster has parameter servers and workers (worker 0 acts as chief); "
                    "write the chief as one more Worker",
                )
                return None
        elif not count["Worker"]:
            self.refusals.add(child(at, "Worker"), "is required: at least one worker")
            return None
        kinds = [chief] if count[chief] else [k for k in ("PS", "Worker") if count[k]]
        restart: set[str] = set()
        containers = self.containers(specs, at, kinds, restart)
        if len(containers) != len(kinds):
            return None
        framework, version = self.runtime(containers, "parameter_server")
        first = containers[kinds[0]]
        argv = self.command_required(first, "give the command that starts the training")
        for kind in kinds[1:]:
            other = containers[kind]
            if (other.argv, other.env) != (first.argv, first.env):
                self.refusals.add(
                    other.command_at,
                    f"is not supported: every learner runs one command, so every replica "
                    f"names the same command, args and env ({kinds[0]}'s)",
                )
        nodes = 1 if count[chief] else count["PS"] + count["Worker"]
        nodes_at = child(child(at, kinds[-1]), "replicas")
        manifest: dict[str, Any] = {
            "name": name,
            "framework": {
                "name": framework,
                "version": version,
                "command": shell_line(first.env, argv or ()),
            },
            "compute_configuration": {
                "name": self.compute(nodes, nodes_at, child(first.pointer, "resources")),
                "nodes": nodes,
            },
        }
        self.written_as["/framework/command"] = first.command_at
        if nodes > 1:
            manifest["framework"]["parameter_servers"] = count["PS"]
            self.written_as["/framework/parameter_servers"] = child(child(at, "PS"), "replicas")
        self.run_policy(manifest, restart)
        return Translation(manifest, dict(self.written_as), tuple(self.notes))

    # -- MPIJob --------------------------------------------------------------------------

    def mpijob(self) -> Translation | None:
        name = self.name()
        check_keys(
            self.spec,
            "/spec",
            self.refusals,
            carried=(
                "mpiReplicaSpecs",
                "runPolicy",
                "slotsPerWorker",
                "runLauncherAsWorker",
                "mpiImplementation",
                "launcherCreationPolicy",
            ),
            # The platform's own ssh set-up (or none) reaches the workers.
            ignored=("sshAuthMountPath",),
        )
        if self.spec.get("mpiImplementation", "OpenMPI") != "OpenMPI":
            self.refusals.add(
                "/spec/mpiImplementation",
                "is not supported: the platform's MPI runtimes ship Open MPI (OpenMPI)",
            )
        at = "/spec/mpiReplicaSpecs"
        specs = mapping_at(self.spec.get("mpiReplicaSpecs"), at, self.refusals)
        check_keys(specs, at, self.refusals, carried=("Launcher", "Worker"))
        if "Launcher" not in specs:
            self.refusals.add(child(at, "Launcher"), "is required: the mpirun line")
            return None
        if self.replicas(specs, at, "Launcher", 1) != 1:
            self.refusals.add(child(child(at, "Launcher"), "replicas"), "must be 1")
        workers = self.replicas(specs, at, "Worker", 1)
        as_worker = self.spec.get("runLauncherAsWorker", False) is True
        if not workers and not as_worker:
            self.refusals.add(child(at, "Worker"), "is required: at least one worker")
            return None
        kinds = ["Launcher", "Worker"] if workers else ["Launcher"]
        restart: set[str] = set()
        containers = self.containers(specs, at, kinds, restart)
        if len(containers) != len(kinds):
            return None
        launcher = containers["Launcher"]
        framework, version = self.runtime(containers, "mpi")
        if workers:
            self._check_worker(containers["Worker"], launcher)
        argv = self.command_required(launcher, "give the mpirun line (mpirun -np N python ...)")
        line = read_mpirun_line(argv or (), launcher.argv_pointers, self.refusals)
        nodes = workers + (1 if as_worker else 0)
        nodes_at = child(child(at, "Worker" if workers else "Launcher"), "replicas")
        compute = self.compute(nodes, nodes_at, child(launcher.pointer, "resources"))
        slots = self._slots(compute)
        total = nodes * slots
        if line is not None and line.ranks is not None and slots and line.ranks != total:
            self.refusals.add(
                line.ranks_at,
                f"-np {line.ranks} is not this job's {nodes} worker(s) x {slots} slot(s) "
                f"= {total}: the platform runs one rank per slot of every worker",
            )
        manifest: dict[str, Any] = {
            "name": name,
            "framework": {
                "name": framework,
                "version": version,
                "command": shell_line(
                    (*launcher.env, *(line.env if line else ())), line.program if line else ()
                ),
            },
            "compute_configuration": {"name": compute, "nodes": nodes},
        }
        self.written_as["/framework/command"] = launcher.command_at
        self.run_policy(manifest, restart)
        return Translation(manifest, dict(self.written_as), tuple(self.notes))

    def _check_worker(self, worker: Container, launcher: Container) -> None:
        """Workers only host the launcher's ranks: their command is sshd or none."""
        if worker.argv and os.path.basename(worker.argv[0]) != "sshd":
            self.refusals.add(
                worker.command_at,
                "is not supported: workers host the ranks of the launcher's mpirun line, "
                "so their command is sshd or none (the platform starts the ranks)",
            )
        if worker.env and worker.env != launcher.env:
            self.refusals.add(
                child(worker.pointer, "env"),
                "is not supported: every rank runs with the launcher's env (and its -x "
                "variables); give the variables there",
            )

    def _slots(self, compute: str) -> int:
        """A worker's slots: slotsPerWorker, which must be the platform's one rank per GPU
        of the compute configuration (one on a configuration without GPUs)."""
        asked = self.spec.get("slotsPerWorker", 1)
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            self.refusals.add("/spec/slotsPerWorker", "must be a whole number >= 1")
            return 0
        spec = self.catalog.compute_configurations.get(compute)
        if spec is None:
            return 0
        slots = max(spec.gpus, 1)
        if asked != slots:
            self.refusals.add(
                "/spec/slotsPerWorker",
                f"{asked} is not supported with {compute}: the platform runs one rank per "
                f"GPU of the compute configuration ({slots}); give the Worker "
                f"nvidia.com/gpu: {asked} in resources.limits, or slotsPerWorker: {slots}",
            )
            return 0
        return slots
