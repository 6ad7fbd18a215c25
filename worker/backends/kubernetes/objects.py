"""The Kubernetes objects of one training, as plain dicts (the API's JSON): a headless
Service, one Pod per learner and a Secret. Pure: no client, no cluster; the backend
creates what these functions return, and the tests validate it against the API's schema.

- Names: `$LEARNER_NAME_PREFIX` (worker.launchers.plan.learner_name_prefix) names the
  headless Service; learner i's pod is `<prefix>-<i>` with hostname `<prefix>-<i>` and
  subdomain `<prefix>` (under FfDL's conventions `<prefix>-<i-1>`, from 0, as FfDL's
  StatefulSet named them), and a DNS search entry for the Service's domain, so both
  `<prefix>-<i>` and `<prefix>-<i>.<prefix>` resolve from every learner. The Service
  publishes learners before they are ready: they find each other while starting.
- Labels: `dlaas.io/training-id`, `dlaas.io/tenant` on every object (what the backend
  watches, lists and reconciles by), and on pods `dlaas.io/learner-id`, the attempt, the
  learner's role and whether it is primary (what an Observation needs, read back from the
  cluster after a restart).
- Credentials: only in the Secret, mounted only into `fetch` and `agent`, each pod's
  volume limited to its own learner's spec; the user's `learner` container mounts no
  spec, only emptyDirs (and, in MPI jobs, the training's key pair and hostfile).
- Everything is owned by one object (`Owner`), so deleting it deletes the training's.
See layout.py for the containers' commands and paths.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.domain.catalog import ComputeSpec
from service.domain.names import is_dns_label, label_value
from service.settings import Settings
from worker.backends.kubernetes import layout
from worker.launchers.plan import (
    GRPC_PORT,
    Addressing,
    LaunchPlan,
    LearnerPlan,
    Role,
    convention_directories,
    first_host_index,
    learner_name_prefix,
)
from worker.launchers.torchrun import RENDEZVOUS_PORT

TRAINING_LABEL = "dlaas.io/training-id"
TENANT_LABEL = "dlaas.io/tenant"
LEARNER_LABEL = "dlaas.io/learner-id"
ATTEMPT_LABEL = "dlaas.io/attempt"
ROLE_LABEL = "dlaas.io/role"
PRIMARY_LABEL = "dlaas.io/primary"

# A Secret holds 1 MiB at most.
SECRET_MAX_BYTES = 1024 * 1024
# The pod's own deadline is a backstop for when the platform is not there to end the
# training at max_runtime; with this margin the monitor's timeout comes first and the
# agent still stores the logs.
DEADLINE_MARGIN_SECONDS = 120
# What the platform's containers (fetch, agent) ask for; the learner gets the
# configuration's resources.
_PLATFORM_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "512Mi"},
}
# What the agent sidecar requests beside each learner container (capacity counts it).
SIDECAR_REQUESTS = _PLATFORM_RESOURCES["requests"]
# The learner images' own PATH (docker/learner-*.Dockerfile: the platform's environment
# first); a runtime's environment goes before it in the learner container.
IMAGE_PATH = "/opt/dlaas/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ClusterConfig:
    """What the objects need of the cluster's settings (DLAAS_K8S_*, whose defaults are
    the only ones: build it with from_settings)."""

    namespace: str
    image_prefix: str
    image_tag: str
    pull_secrets: tuple[str, ...]
    gpu_resource: str
    cluster_domain: str

    @classmethod
    def from_settings(cls, settings: Settings) -> ClusterConfig:
        return cls(
            namespace=settings.k8s_namespace,
            image_prefix=settings.k8s_image_prefix,
            image_tag=settings.k8s_image_tag,
            pull_secrets=settings.k8s_pull_secret_names,
            gpu_resource=settings.k8s_gpu_resource,
            cluster_domain=settings.k8s_cluster_domain,
        )

    def learner_image(self, runtime: str) -> str:
        """The learner image of runtime `runtime` (one per runtime)."""
        return f"{self.image_prefix}learner-{runtime}:{self.image_tag}"

    @property
    def platform_image(self) -> str:
        """The platform's image, which fetch and agent run."""
        return f"{self.image_prefix}platform:{self.image_tag}"


@dataclass(frozen=True)
class Owner:
    """The object every other object of the training is owned by (e.g. a ConfigMap the
    backend creates first): deleting it has the garbage collector delete them all."""

    name: str
    uid: str
    kind: str = "ConfigMap"
    api_version: str = "v1"


@dataclass(frozen=True)
class SshKeyPair:
    """A training's MPI key pair, OpenSSH format (made elsewhere, once per training)."""

    private_key: str = field(repr=False)
    public_key: str


@dataclass(frozen=True)
class TrainingObjectsInput:
    """One training (one attempt) as its objects need it: the launch plan (made with
    learner_name_prefix's host names and, for MPI, layout.mpi_setup()), each learner's
    spec (its directories layout.DIRECTORIES), the runtime whose learner image runs the
    command, the compute configuration, and the owner."""

    training_id: str
    tenant: str
    plan: LaunchPlan
    # Learner id -> its LearnerSpec's JSON (credentials in clear: it goes to the Secret).
    learner_specs: Mapping[int, str] = field(repr=False)
    runtime: str
    compute: ComputeSpec
    max_runtime: int
    distribution: str  # the framework's: "parameter_server", "mpi" or "torchrun"
    owner: Owner
    attempt: int = 1
    ssh: SshKeyPair | None = None
    stop_grace_seconds: int = 30
    # Where the runtime's environment lies in its learner image (runtimes.in_learner_image);
    # None for the platform's. Its bin/ (python, torchrun, mpirun) comes first on the
    # learner's PATH, its lib/ (its own libmpi) on LD_LIBRARY_PATH, as on one machine.
    runtime_prefix: str | None = None

    @property
    def prefix(self) -> str:
        return learner_name_prefix(self.training_id)

    @property
    def mpi(self) -> bool:
        return self.distribution == "mpi"

    @property
    def learner_port(self) -> tuple[str, int]:
        """The port learners serve each other, named: sshd for MPI jobs, torchrun's
        rendezvous (learner 1's c10d store) for PyTorch, TensorFlow's gRPC otherwise."""
        if self.mpi:
            return "ssh", layout.SSH_PORT
        if self.distribution == "torchrun":
            return "rendezvous", RENDEZVOUS_PORT
        return "grpc", GRPC_PORT


def secret_name(prefix: str) -> str:
    return f"{prefix}-secret"


def training_labels(training_id: str, tenant: str) -> dict[str, str]:
    """The labels every object of a training carries (and the backend selects by)."""
    return {TRAINING_LABEL: label_value(training_id), TENANT_LABEL: label_value(tenant)}


def _metadata(name: str, inp: TrainingObjectsInput, cluster: ClusterConfig) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": cluster.namespace,
        "labels": training_labels(inp.training_id, inp.tenant),
        "ownerReferences": [
            {
                "apiVersion": inp.owner.api_version,
                "kind": inp.owner.kind,
                "name": inp.owner.name,
                "uid": inp.owner.uid,
                "controller": True,
            }
        ],
    }


def object_metadata(name: str, inp: TrainingObjectsInput, cluster: ClusterConfig) -> dict[str, Any]:
    """The metadata of an object of the training: its labels, owned by `inp.owner`."""
    return _metadata(name, inp, cluster)


def _check(inp: TrainingObjectsInput) -> None:
    ids = [lp.learner_id for lp in inp.plan.learners]
    if sorted(inp.learner_specs) != sorted(ids):
        raise ValueError(f"learner specs for {sorted(inp.learner_specs)}, learners {ids}")
    if inp.mpi and inp.ssh is None:
        raise ValueError("an MPI training needs its SSH key pair")
    if inp.max_runtime < 1:
        raise ValueError("max_runtime must be positive")
    first = first_host_index(inp.plan.conventions)
    for lp in inp.plan.learners:
        expected = Addressing.host_names(inp.prefix, lp.learner_id, first)[-1]
        if lp.hostname != expected or not is_dns_label(lp.hostname):
            raise ValueError(
                f"learner {lp.learner_id}'s host name {lp.hostname!r} is not "
                f"{expected}: plan with learner_name_prefix"
            )


def training_objects(inp: TrainingObjectsInput, cluster: ClusterConfig) -> list[dict[str, Any]]:
    """Every object of the training, in the order to create them: the Secret the pods
    mount, the Service they are found by, then the pods."""
    _check(inp)
    return [
        training_secret(inp, cluster),
        headless_service(inp, cluster),
        *(learner_pod(inp, lp, cluster) for lp in inp.plan.learners),
    ]


def headless_service(inp: TrainingObjectsInput, cluster: ClusterConfig) -> dict[str, Any]:
    name, number = inp.learner_port
    port = {"name": name, "port": number, "targetPort": name, "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(inp.prefix, inp, cluster),
        "spec": {
            "clusterIP": "None",
            "selector": {TRAINING_LABEL: label_value(inp.training_id)},
            # Learners resolve each other while they start, before any is ready.
            "publishNotReadyAddresses": True,
            "ports": [port],
        },
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def training_secret(inp: TrainingObjectsInput, cluster: ClusterConfig) -> dict[str, Any]:
    """The learners' specs (with the store's credentials) and, for MPI jobs, the key pair
    and the hostfile. Immutable: a training's Secret never changes."""
    data = {layout.spec_file(i): _b64(spec) for i, spec in sorted(inp.learner_specs.items())}
    if inp.ssh is not None:
        authorized = inp.ssh.public_key.rstrip("\n") + "\n"
        data |= {
            "id_ed25519": _b64(inp.ssh.private_key),
            "id_ed25519.pub": _b64(authorized),
            "authorized_keys": _b64(authorized),
        }
    if inp.plan.hostfile is not None:
        data["hostfile"] = _b64(inp.plan.hostfile)
    size = sum(len(k) + len(v) * 3 // 4 for k, v in data.items())
    if size > SECRET_MAX_BYTES:
        raise ValueError(f"the training's Secret would hold {size} bytes, over 1 MiB")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(secret_name(inp.prefix), inp, cluster),
        "type": "Opaque",
        "immutable": True,
        "data": data,
    }


def learner_env(lp: LearnerPlan, conventions: str) -> dict[str, str]:
    """Learner `lp`'s environment in its pod: the plan's (the learner contract), with the
    pod's directories (FfDL's JOB_STATE_DIR, /job, too under its `conventions`)."""
    return {
        **lp.env,
        **layout.DIRECTORIES,
        **convention_directories(conventions, layout.DIRECTORIES),
    }


def _resources(compute: ComputeSpec, cluster: ClusterConfig) -> dict[str, Any]:
    amounts: dict[str, str] = {"cpu": str(compute.cpus), "memory": f"{compute.memory_gib}Gi"}
    if compute.gpus:
        amounts[cluster.gpu_resource] = str(compute.gpus)
    # Requests equal to limits: a learner gets what its configuration promises, no more.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _container_security() -> dict[str, Any]:
    """Every container's own: the pod's user and seccomp profile repeated (a container
    cannot be given root back by a later pod-level change), no privilege escalation, no
    capability, nothing writable but its volumes (the training's directories, io, /tmp)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": layout.RUN_AS_USER,
        "runAsGroup": layout.RUN_AS_GROUP,
        "seccompProfile": {"type": "RuntimeDefault"},
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _mount(name: str, path: str, read_only: bool = False) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    return mount


def _platform_container(
    name: str, command: list[str], cluster: ClusterConfig, *, sidecar: bool
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": cluster.platform_image,
        "command": command,
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": _PLATFORM_RESOURCES,
        "securityContext": _container_security(),
        "volumeMounts": [
            _mount("spec", layout.SPEC_DIR, read_only=True),
            _mount("work", layout.WORK_DIR),
            _mount("io", layout.IO_DIR),
            _mount("tmp", layout.TMP_DIR),
        ],
    }
    if sidecar:
        # A native sidecar: started before the learner, stopped after it.
        container["restartPolicy"] = "Always"
    return container


def _learner_container(
    inp: TrainingObjectsInput, lp: LearnerPlan, cluster: ClusterConfig
) -> dict[str, Any]:
    mpi_host = lp.role == Role.MPI_HOST
    argv = layout.mpi_host_argv() if mpi_host else lp.argv
    wait_for: tuple[str, ...] = ()
    if lp.waits_for_peers:
        wait_for = tuple(
            f"{other.hostname}:{inp.learner_port[1]}"
            for other in inp.plan.learners
            if other.learner_id != lp.learner_id
        )
    env = learner_env(lp, inp.plan.conventions)
    if inp.runtime_prefix:
        env["PATH"] = f"{inp.runtime_prefix}/bin:{IMAGE_PATH}"
        env["LD_LIBRARY_PATH"] = f"{inp.runtime_prefix}/lib"
    mounts = [
        _mount("work", layout.WORK_DIR),
        _mount("io", layout.IO_DIR),
        _mount("tmp", layout.TMP_DIR),
    ]
    container: dict[str, Any] = {
        "name": layout.LEARNER_CONTAINER,
        "image": cluster.learner_image(inp.runtime),
        "command": layout.run_command(argv, wait_for),
        "workingDir": env["MODEL_DIR"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": _resources(inp.compute, cluster),
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }
    if inp.mpi:
        mounts.append(_mount("ssh", layout.SSH_DIR, read_only=True))
        if lp.role == Role.MPI_LAUNCHER:
            mounts.append(_mount("mpi", layout.MPI_DIR, read_only=True))
        if mpi_host:
            # Ready once sshd accepts connections: what the launcher waits for.
            container["readinessProbe"] = {"tcpSocket": {"port": "ssh"}, "periodSeconds": 2}
    port_name, port = inp.learner_port
    container["ports"] = [{"name": port_name, "containerPort": port, "protocol": "TCP"}]
    return container


def _secret_volume(name: str, secret: str, keys: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "secret": {
            "secretName": secret,
            "items": [{"key": k, "path": k} for k in keys],
            "defaultMode": 0o400,
        },
    }


def _volumes(inp: TrainingObjectsInput, lp: LearnerPlan) -> list[dict[str, Any]]:
    secret = secret_name(inp.prefix)
    volumes = [
        _secret_volume("spec", secret, [layout.spec_file(lp.learner_id)]),
        {"name": "work", "emptyDir": {}},
        {"name": "io", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if inp.mpi:
        volumes.append(_secret_volume("ssh", secret, list(layout.SSH_KEY_NAMES)))
        if lp.role == Role.MPI_LAUNCHER:
            volumes.append(_secret_volume("mpi", secret, ["hostfile"]))
    return volumes


def _tolerations(compute: ComputeSpec) -> list[dict[str, Any]]:
    out = []
    for t in compute.tolerations:
        toleration: dict[str, Any] = {"operator": t.operator}
        if t.key:
            toleration["key"] = t.key
        if t.value:
            toleration["value"] = t.value
        if t.effect is not None:
            toleration["effect"] = t.effect
        if t.toleration_seconds is not None:
            toleration["tolerationSeconds"] = t.toleration_seconds
        out.append(toleration)
    return out


def learner_pod(
    inp: TrainingObjectsInput, lp: LearnerPlan, cluster: ClusterConfig
) -> dict[str, Any]:
    """Learner `lp`'s pod: fetch, then the agent beside the user's learner container."""
    prefix = inp.prefix
    metadata = _metadata(lp.hostname, inp, cluster)
    metadata["labels"] |= {
        LEARNER_LABEL: str(lp.learner_id),
        ATTEMPT_LABEL: str(inp.attempt),
        ROLE_LABEL: lp.role.value,
        PRIMARY_LABEL: "true" if lp.primary else "false",
    }
    spec: dict[str, Any] = {
        "hostname": lp.hostname,
        "subdomain": prefix,
        "dnsConfig": {"searches": [f"{prefix}.{cluster.namespace}.svc.{cluster.cluster_domain}"]},
        "restartPolicy": "Never",
        "activeDeadlineSeconds": inp.max_runtime + DEADLINE_MARGIN_SECONDS,
        "terminationGracePeriodSeconds": inp.stop_grace_seconds,
        "automountServiceAccountToken": False,
        # No other Service's address in the learner's environment.
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": layout.RUN_AS_USER,
            "runAsGroup": layout.RUN_AS_GROUP,
            "fsGroup": layout.RUN_AS_GROUP,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [
            _platform_container(
                layout.FETCH_CONTAINER,
                layout.fetch_command(lp.learner_id),
                cluster,
                sidecar=False,
            ),
            _platform_container(
                layout.AGENT_CONTAINER,
                layout.agent_command(lp.learner_id),
                cluster,
                sidecar=True,
            ),
        ],
        "containers": [_learner_container(inp, lp, cluster)],
        "volumes": _volumes(inp, lp),
    }
    if inp.compute.node_selector:
        spec["nodeSelector"] = dict(inp.compute.node_selector)
    if inp.compute.tolerations:
        spec["tolerations"] = _tolerations(inp.compute)
    if cluster.pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in cluster.pull_secrets]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
