"""Horovod and IBM DDL: one MPI job across the learners.

Learner 1 is the launcher: once every learner has its code in place it runs the command
under `mpirun` with a hostfile of all learner hosts (slots = GPUs per node, 1 on a CPU-only
configuration), one rank per slot; the learner environment reaches every rank (`-x`), and
a per-rank prefix sets the variables that differ by host (LEARNER_ID, the directories).
The other learners only host ranks. The training completes when learner 1 exits 0.

DDL (tensorflow-ddl, pytorch-ddl) runs on the same launch and adds DDL_OPTIONS and a
rank -> GPU mapping.
"""

from __future__ import annotations

from worker.launchers.plan import (
    Addressing,
    LaunchPlan,
    LearnerPlan,
    MpiSetup,
    Role,
    TrainingSpec,
    base_env,
    shell,
)

# Ranks are not bound to cores (Horovod's own launch line, `-bind-to none -map-by slot`):
# each learner is a host of its own to mpirun, whose default (`--bind-to core` for up to
# two ranks) bound every host's first rank to core 0, so that learners sharing a machine
# (the local backend, pods on one node) ran all their ranks on one core; a 2-learner
# Horovod job ran at half the speed of the same `mpirun -np 2` by hand.
# Passed to every rank; the rank prefix overrides the per-learner ones.
_SHARED_VARS = ("TRAINING_ID", "NUM_LEARNERS", "LEARNER_NAME_PREFIX", "GPU_COUNT")
DDL_DEFAULT_OPTIONS = "-mode r:{gpus}x{nodes}"
# Open MPI's transports: TCP (the btl each backend names) under the ob1 point-to-point
# layer, and no UCX. The runtime's Open MPI has UCX built in, and its ucx pml and osc
# components start UCX, which probes every network interface through /sys/class/net: in
# a learner's sandbox there is none, and every rank logged `UCX ERROR scandir(...)`
# although the job then runs on TCP. ob1 alone starts no UCX (nor the cm pml's libfabric);
# `osc ^ucx` keeps one-sided windows (MPI_Win) off UCX too.
TRANSPORTS = ("--mca", "pml", "ob1", "--mca", "osc", "^ucx")
# The frameworks whose ranks use the open DDL (TensorFlow's API, or PyTorch's).
DDL_FRAMEWORKS = ("tensorflow-ddl", "pytorch-ddl")


def plan_mpi(spec: TrainingSpec, addressing: Addressing, mpi: MpiSetup) -> LaunchPlan:
    slots = max(spec.gpus_per_node, 1)
    ranks = slots * spec.nodes
    hostfile = "".join(f"{host} slots={slots}\n" for host in addressing.hostnames)
    ddl = spec.framework in DDL_FRAMEWORKS

    env1 = base_env(spec, addressing, 1)
    exported = list(_SHARED_VARS)
    if ddl:
        env1["DDL_OPTIONS"] = DDL_DEFAULT_OPTIONS.format(gpus=slots, nodes=spec.nodes)
        exported.append("DDL_OPTIONS")
    argv: list[str] = [mpi.mpirun, "-np", str(ranks), "--hostfile", mpi.hostfile_path]
    argv += ["--map-by", "slot", "--bind-to", "none", *TRANSPORTS, *mpi.options]
    if "DLAAS_JOB_ID" in env1:  # FfDL's conventions
        exported.append("DLAAS_JOB_ID")
    for name in exported:
        argv += ["-x", name]
    if ddl and spec.gpus_per_node:
        # Each rank sees exactly its GPU (local rank -> device), as DDL expects.
        argv += ["-x", "DLAAS_MAP_GPU_BY_LOCAL_RANK=1"]
    argv += [*mpi.rank_prefix, *shell(spec.command)]

    learners = [
        LearnerPlan(
            learner_id=1,
            hostname=addressing.hostnames[0],
            role=Role.MPI_LAUNCHER,
            primary=True,
            argv=tuple(argv),
            env=env1,
            waits_for_peers=spec.nodes > 1,
        )
    ]
    for i in range(2, spec.nodes + 1):
        learners.append(
            LearnerPlan(
                learner_id=i,
                hostname=addressing.hostnames[i - 1],
                role=Role.MPI_HOST,
                primary=False,
                argv=("sleep", "infinity"),
                env=base_env(spec, addressing, i),
            )
        )
    return LaunchPlan(
        spec.training_id, tuple(learners), hostfile=hostfile, conventions=spec.conventions
    )
