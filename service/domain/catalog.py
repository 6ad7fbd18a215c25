"""The catalogs a manifest is checked against: frameworks, compute configurations, plans.

Pure data. The defaults mirror the seed documents (TensorFlow 1.5, P100 for distributed
jobs, a Lite plan without distributed training) plus the TensorFlow 2.x line the local
runtime ships; an operator replaces any section with a YAML file (DLAAS_CATALOG_FILE).

Each framework version runs in a runtime (FrameworkSpec.runtimes): `platform`, the
platform's own Python with its `tensorflow` extra, or a pinned environment whose
requirements live in the repository's `runtimes/NAME.txt` (service.runtimes installs it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.domain.names import is_label_key, is_label_value

# The platform's own Python environment (sys.executable's), always installed.
PLATFORM_RUNTIME = "platform"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FrameworkSpec(_Frozen):
    """A framework users can name in a manifest."""

    versions: tuple[str, ...] = Field(min_length=1)
    # "parameter_server": gRPC cluster (TF_CONFIG); "mpi": one rank per GPU under mpirun;
    # "torchrun": every learner runs torchrun (one process per GPU), a static rendezvous on
    # learner 1, and the training completes when every learner's torchrun exited 0.
    distribution: Literal["parameter_server", "mpi", "torchrun"]
    # MPI frameworks exist to distribute: a single-node job is refused.
    requires_multiple_nodes: bool = False
    # Its trainings leave native TensorFlow models, the only ones deployed for online
    # scoring. Not given (an operator's catalog from before this setting): judged by the
    # framework's name, see Catalog.native_tensorflow.
    native_tensorflow: bool | None = None
    # The runtime each version runs in: "platform" or a file runtimes/<name>.txt. A version
    # not named here (an operator's catalog from before this setting) runs in "platform".
    runtimes: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _runtimes_of_offered_versions(self) -> FrameworkSpec:
        unknown = set(self.runtimes) - set(self.versions)
        if unknown:
            raise ValueError(f"runtimes name versions not offered: {', '.join(sorted(unknown))}")
        return self

    def runtime(self, version: str) -> str:
        """The runtime `version` runs in."""
        return self.runtimes.get(version, PLATFORM_RUNTIME)


class Toleration(_Frozen):
    """A node taint the learners of a compute configuration tolerate (Kubernetes backend),
    in Kubernetes' terms: `key` empty with `Exists` tolerates every taint."""

    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    # None: every effect.
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    # NoExecute only: how long a learner stays on a node once the taint appears.
    toleration_seconds: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        if self.key and not is_label_key(self.key):
            raise ValueError(f"toleration key '{self.key}' is not a valid label key")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must use the operator Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with the operator Exists takes no value")
        if not is_label_value(self.value):
            raise ValueError(f"toleration value '{self.value}' is not a valid label value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds applies to the effect NoExecute only")
        return self


class ComputeSpec(_Frozen):
    """Resources of one node of a compute configuration."""

    gpus: int = Field(ge=0)
    cpus: int = Field(ge=1)
    memory_gib: int = Field(ge=1)
    supports_distributed: bool = False
    # Kubernetes backend: the node labels a learner's pod requires (e.g. the GPU product
    # that GPU feature discovery labels nodes with) and the taints it tolerates.
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()

    @field_validator("node_selector")
    @classmethod
    def _node_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not is_label_key(key):
                raise ValueError(f"node_selector key '{key}' is not a valid label key")
            if not is_label_value(label):
                raise ValueError(f"node_selector value '{label}' is not a valid label value")
        return value


class PlanSpec(_Frozen):
    """What a tenant's plan allows."""

    distributed: bool
    max_nodes: int = Field(ge=1)
    max_concurrent_trainings: int = Field(ge=1)
    predictions_per_minute: int = Field(ge=1)
    # Learner slots (nodes) the tenant's active trainings may hold at once, all together:
    # one tenant cannot hold every slot of the machine or cluster. Unset: max_nodes times
    # max_concurrent_trainings (no bound beyond those two); see `active_nodes_limit`.
    max_active_nodes: int | None = Field(default=None, ge=1)
    # Requests a second to the REST API and the scoring gRPC port, across all the tenant's
    # keys (a token bucket that holds `request_burst`; service.http.rates).
    requests_per_second: float = Field(default=10_000, gt=0)
    request_burst: int = Field(default=20_000, ge=1)
    # Bounded use (service.domain.quotas): trainings waiting in the queue, deployments
    # kept, and the max_runtime a manifest gets when it names none and may name at most.
    max_queued_trainings: int = Field(default=20, ge=1)
    max_deployments: int = Field(default=10, ge=1)
    # Code archives and results of the tenant's trainings, in bytes.
    max_stored_bytes: int = Field(default=50 * 2**30, ge=1)
    # Log bytes a training keeps (live log and training-log.txt), shared equally by its
    # learners; the rest is dropped after a marker line.
    max_log_bytes_per_training: int = Field(default=256 * 2**20, ge=1)
    default_max_runtime: int = Field(default=24 * 3600, ge=1)
    max_max_runtime: int = Field(default=7 * 24 * 3600, ge=1)
    # How many times a training may be started again (its manifest's retry_policy): a
    # retry holds the tenant's learners again, so the plan caps it.
    max_retries: int = Field(default=3, ge=0)

    @model_validator(mode="after")
    def _default_within_maximum(self) -> PlanSpec:
        if self.default_max_runtime > self.max_max_runtime:
            raise ValueError("default_max_runtime must not exceed max_max_runtime")
        return self

    @property
    def active_nodes_limit(self) -> int:
        """The learner slots the tenant's active trainings may hold at once."""
        if self.max_active_nodes is not None:
            return self.max_active_nodes
        return self.max_nodes * self.max_concurrent_trainings


class Catalog(_Frozen):
    frameworks: dict[str, FrameworkSpec]
    compute_configurations: dict[str, ComputeSpec]
    plans: dict[str, PlanSpec]

    def with_overrides(self, data: dict[str, Any]) -> Catalog:
        """A catalog whose sections present in `data` replace the defaults whole."""
        unknown = set(data) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"unknown catalog sections: {', '.join(sorted(unknown))}")
        merged = self.model_dump()
        merged.update(data)
        return Catalog.model_validate(merged)

    def native_tensorflow(self, framework_name: str) -> bool:
        """Whether trainings of `framework_name` leave native TensorFlow models (the rule of
        online deployment): as the catalog says; where it does not (the framework is not
        set, or no longer in the catalog), a "tensorflow..." name is native TensorFlow."""
        spec = self.frameworks.get(framework_name)
        if spec is None or spec.native_tensorflow is None:
            return framework_name.startswith("tensorflow")
        return spec.native_tensorflow

    def runtime(self, framework_name: str, version: str) -> str:
        """The runtime trainings of (framework, version) run in; "platform" for a framework
        no longer in the catalog."""
        spec = self.frameworks.get(framework_name)
        return spec.runtime(version) if spec is not None else PLATFORM_RUNTIME

    def runtimes_used(self) -> dict[str, list[tuple[str, str]]]:
        """Each runtime the catalog names, with the (framework, version) pairs it serves."""
        used: dict[str, list[tuple[str, str]]] = {PLATFORM_RUNTIME: []}
        for name, spec in sorted(self.frameworks.items()):
            for version in spec.versions:
                used.setdefault(spec.runtime(version), []).append((name, version))
        return used


TENSORFLOW_VERSIONS = ("1.5", "2.21")
# Both TensorFlow versions run in the platform's own environment, TensorFlow 2.21: 1.5 (the
# seed documents') cannot run on Python 3.11, so a "1.5" script is served by TensorFlow 2.x,
# where its graph-mode API is `tf.compat.v1`.
_PLATFORM_TENSORFLOW = dict.fromkeys(TENSORFLOW_VERSIONS, PLATFORM_RUNTIME)
# Horovod 0.28.1 (its last release) builds against TensorFlow 2.14 at the newest, so both
# versions of the MPI frameworks run in runtimes/horovod-tf2.14.txt (TensorFlow 2.14.1,
# Horovod 0.28.1, Open MPI 5). DDL trainings run in runtimes/ddl-tf2.14.txt: the same pins plus the
# open `ddl` package (runtimes/packages/ddl), IBM DDL's API over Horovod's collectives.
HOROVOD_RUNTIME = "horovod-tf2.14"
_HOROVOD = dict.fromkeys(TENSORFLOW_VERSIONS, HOROVOD_RUNTIME)
DDL_RUNTIME = "ddl-tf2.14"
_DDL = dict.fromkeys(TENSORFLOW_VERSIONS, DDL_RUNTIME)
# PyTorch 2.13 (CPU) runs in runtimes/pytorch2.13.txt, with the open DDL's PyTorch API
# (runtimes/packages/ddl-torch) for pytorch-ddl. No pytorch-horovod: Horovod 0.28.1 does not
# build against torch 2.13 (README, PyTorch).
PYTORCH_VERSIONS = ("2.13",)
PYTORCH_RUNTIME = "pytorch2.13"
_PYTORCH = dict.fromkeys(PYTORCH_VERSIONS, PYTORCH_RUNTIME)

# The label NVIDIA's GPU feature discovery puts on each GPU node, and its values for the
# seed documents' cards; GPU nodes are commonly tainted nvidia.com/gpu (NoSchedule), which
# GPU learners tolerate. An operator's catalog file replaces them with its cluster's.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
K80_PRODUCT = "Tesla-K80"
P100_PRODUCT = "Tesla-P100-PCIE-16GB"
V100_PRODUCT = "Tesla-V100-SXM2-16GB"
GPU_TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


def _on_gpu(product: str) -> dict[str, Any]:
    return {"node_selector": {GPU_PRODUCT_LABEL: product}, "tolerations": (GPU_TOLERATION,)}


DEFAULT_CATALOG = Catalog(
    frameworks={
        "tensorflow": FrameworkSpec(
            versions=TENSORFLOW_VERSIONS,
            distribution="parameter_server",
            native_tensorflow=True,
            runtimes=_PLATFORM_TENSORFLOW,
        ),
        "tensorflow-ddl": FrameworkSpec(
            versions=TENSORFLOW_VERSIONS,
            distribution="mpi",
            requires_multiple_nodes=True,
            native_tensorflow=True,
            runtimes=_DDL,
        ),
        "tensorflow-horovod": FrameworkSpec(
            versions=TENSORFLOW_VERSIONS,
            distribution="mpi",
            requires_multiple_nodes=True,
            native_tensorflow=True,
            runtimes=_HOROVOD,
        ),
        "pytorch": FrameworkSpec(
            versions=PYTORCH_VERSIONS,
            distribution="torchrun",
            native_tensorflow=False,
            runtimes=_PYTORCH,
        ),
        "pytorch-ddl": FrameworkSpec(
            versions=PYTORCH_VERSIONS,
            distribution="mpi",
            requires_multiple_nodes=True,
            native_tensorflow=False,
            runtimes=_PYTORCH,
        ),
    },
    compute_configurations={
        "K80": ComputeSpec(gpus=1, cpus=4, memory_gib=24, **_on_gpu(K80_PRODUCT)),
        "K80x2": ComputeSpec(gpus=2, cpus=8, memory_gib=48, **_on_gpu(K80_PRODUCT)),
        "P100": ComputeSpec(
            gpus=1, cpus=8, memory_gib=24, supports_distributed=True, **_on_gpu(P100_PRODUCT)
        ),
        "P100x2": ComputeSpec(
            gpus=2, cpus=16, memory_gib=48, supports_distributed=True, **_on_gpu(P100_PRODUCT)
        ),
        "V100": ComputeSpec(gpus=1, cpus=8, memory_gib=24, **_on_gpu(V100_PRODUCT)),
        "V100x2": ComputeSpec(gpus=2, cpus=16, memory_gib=48, **_on_gpu(V100_PRODUCT)),
    },
    plans={
        "lite": PlanSpec(
            distributed=False,
            max_nodes=1,
            max_concurrent_trainings=1,
            predictions_per_minute=500,
            requests_per_second=50,
            request_burst=100,
            max_queued_trainings=5,
            max_deployments=2,
            max_stored_bytes=5 * 2**30,
            max_log_bytes_per_training=16 * 2**20,
            default_max_runtime=3600,
            max_max_runtime=6 * 3600,
            max_retries=1,
        ),
        "standard": PlanSpec(
            distributed=True,
            max_nodes=16,
            max_concurrent_trainings=8,
            predictions_per_minute=60_000,
        ),
    },
)
