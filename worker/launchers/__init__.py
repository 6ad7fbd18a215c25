"""Framework launchers: pure functions from a training to a LaunchPlan."""

from __future__ import annotations

from worker.launchers.mpi import plan_mpi
from worker.launchers.plan import Addressing, LaunchPlan, MpiSetup, TrainingSpec
from worker.launchers.tensorflow import plan_tensorflow
from worker.launchers.torchrun import plan_torchrun


def plan_launch(spec: TrainingSpec, addressing: Addressing, mpi: MpiSetup | None) -> LaunchPlan:
    """The launch plan for a training of any catalog framework."""
    if spec.distribution == "mpi":
        if mpi is None:
            raise ValueError(f"{spec.framework} needs an MPI setup from the backend")
        return plan_mpi(spec, addressing, mpi)
    if spec.distribution == "torchrun":
        return plan_torchrun(spec, addressing)
    return plan_tensorflow(spec, addressing)


__all__ = ["Addressing", "LaunchPlan", "MpiSetup", "TrainingSpec", "plan_launch"]
