"""The catalogs a manifest is checked against: frameworks, compute configurations, plans.

Pure data. The defaults mirror the seed documents (TensorFlow 1.5, P100 for distributed
jobs, a Lite plan without distributed training) plus the TensorFlow 2.x line the local
runtime ships; an operator replaces any section with a YAML file (DLAAS_CATALOG_FILE).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FrameworkSpec(_Frozen):
    """A framework users can name in a manifest."""

    versions: tuple[str, ...] = Field(min_length=1)
    # "parameter_server": gRPC cluster (TF_CONFIG); "mpi": one rank per GPU under mpirun.
    distribution: Literal["parameter_server", "mpi"]
    # MPI frameworks exist to distribute: a single-node job is refused.
    requires_multiple_nodes: bool = False
    # Its trainings leave native TensorFlow models, the only ones deployed for online
    # scoring. Not given (an operator's catalog from before this setting): judged by the
    # framework's name, see Catalog.native_tensorflow.
    native_tensorflow: bool | None = None


class ComputeSpec(_Frozen):
    """Resources of one node of a compute configuration."""

    gpus: int = Field(ge=0)
    cpus: int = Field(ge=1)
    memory_gib: int = Field(ge=1)
    supports_distributed: bool = False


class PlanSpec(_Frozen):
    """What a tenant's plan allows."""

    distributed: bool
    max_nodes: int = Field(ge=1)
    max_concurrent_trainings: int = Field(ge=1)
    predictions_per_minute: int = Field(ge=1)
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

    @model_validator(mode="after")
    def _default_within_maximum(self) -> PlanSpec:
        if self.default_max_runtime > self.max_max_runtime:
            raise ValueError("default_max_runtime must not exceed max_max_runtime")
        return self


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


TENSORFLOW_VERSIONS = ("1.5", "2.21")

DEFAULT_CATALOG = Catalog(
    frameworks={
        "tensorflow": FrameworkSpec(
            versions=TENSORFLOW_VERSIONS, distribution="parameter_server", native_tensorflow=True
        ),
        "tensorflow-ddl": FrameworkSpec(
            versions=TENSORFLOW_VERSIONS,
            distribution="mpi",
            requires_multiple_nodes=True,
            native_tensorflow=True,
        ),
        "tensorflow-horovod": FrameworkSpec(
            versions=TENSORFLOW_VERSIONS,
            distribution="mpi",
            requires_multiple_nodes=True,
            native_tensorflow=True,
        ),
    },
    compute_configurations={
        "K80": ComputeSpec(gpus=1, cpus=4, memory_gib=24),
        "K80x2": ComputeSpec(gpus=2, cpus=8, memory_gib=48),
        "P100": ComputeSpec(gpus=1, cpus=8, memory_gib=24, supports_distributed=True),
        "P100x2": ComputeSpec(gpus=2, cpus=16, memory_gib=48, supports_distributed=True),
        "V100": ComputeSpec(gpus=1, cpus=8, memory_gib=24),
        "V100x2": ComputeSpec(gpus=2, cpus=16, memory_gib=48),
    },
    plans={
        "lite": PlanSpec(
            distributed=False,
            max_nodes=1,
            max_concurrent_trainings=1,
            predictions_per_minute=500,
            max_queued_trainings=5,
            max_deployments=2,
            max_stored_bytes=5 * 2**30,
            max_log_bytes_per_training=16 * 2**20,
            default_max_runtime=3600,
            max_max_runtime=6 * 3600,
        ),
        "standard": PlanSpec(
            distributed=True,
            max_nodes=16,
            max_concurrent_trainings=8,
            predictions_per_minute=60_000,
        ),
    },
)
