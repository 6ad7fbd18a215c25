"""Launch plans, table-driven: who runs what, with which environment."""

from __future__ import annotations

import dataclasses
import json

import pytest

from worker.launchers import plan_launch
from worker.launchers.plan import (
    DLAAS_CONVENTIONS,
    FFDL_CONVENTIONS,
    STOP_TRAP,
    Addressing,
    MpiSetup,
    Role,
    TrainingSpec,
    convention_directories,
    first_host_index,
)

MPI = MpiSetup(
    mpirun="/venv/bin/mpirun",
    hostfile_path="/work/t1/hostfile",
    options=("--prtemca", "plm_ssh_agent", "/work/t1/agent"),
    rank_prefix=("python", "-m", "worker.learner.rank", "/work/t1/ranks.json", "--"),
)


def spec(framework: str = "tensorflow", nodes: int = 1, ps: int = 0, gpus: int = 1) -> TrainingSpec:
    return TrainingSpec(
        training_id="t1",
        framework=framework,
        version="1.5",
        command="python3 train.py --steps 5",
        nodes=nodes,
        parameter_servers=ps,
        gpus_per_node=gpus,
        distribution="mpi" if framework != "tensorflow" else "parameter_server",
    )


HOSTS = Addressing.per_learner_hosts("learner-t1", 3)


@pytest.mark.parametrize(
    ("nodes", "ps", "roles", "primaries"),
    [
        (1, 0, ["single"], [1]),
        (2, 1, ["ps", "worker"], [2]),
        (3, 1, ["ps", "worker", "worker"], [2, 3]),
        (3, 2, ["ps", "ps", "worker"], [3]),
        (2, 0, ["worker", "worker"], [1, 2]),
    ],
)
def test_tensorflow_roles(nodes: int, ps: int, roles: list[str], primaries: list[int]) -> None:
    plan = plan_launch(spec(nodes=nodes, ps=ps), Addressing.per_learner_hosts("p", nodes), None)
    assert [lp.role.value for lp in plan.learners] == roles
    assert list(plan.primaries) == primaries
    # The shell waits for the command's programs on a stop (their grace period).
    command = STOP_TRAP + "python3 train.py --steps 5"
    assert all(lp.argv == ("/bin/sh", "-c", command) for lp in plan.learners)


def test_tensorflow_single_learner_env() -> None:
    plan = plan_launch(spec(), Addressing.per_learner_hosts("learner-t1", 1), None)
    (learner,) = plan.learners
    assert learner.env == {
        "TRAINING_ID": "t1",
        "LEARNER_ID": "1",
        "NUM_LEARNERS": "1",
        "LEARNER_NAME_PREFIX": "learner-t1",
        "GPU_COUNT": "1",
    }
    assert learner.hostname == "learner-t1-1"


def test_tensorflow_cluster_spec_in_tf_config() -> None:
    plan = plan_launch(spec(nodes=3, ps=1), HOSTS, None)
    configs = [json.loads(lp.env["TF_CONFIG"]) for lp in plan.learners]
    cluster = {"ps": ["learner-t1-1:2222"], "worker": ["learner-t1-2:2222", "learner-t1-3:2222"]}
    assert [c["cluster"] for c in configs] == [cluster] * 3
    assert [c["task"] for c in configs] == [
        {"type": "ps", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert {lp.env["PS_HOSTS_COUNT"] for lp in plan.learners} == {"1"}
    assert [lp.env["LEARNER_ID"] for lp in plan.learners] == ["1", "2", "3"]


def test_all_worker_cluster_has_no_ps_job() -> None:
    plan = plan_launch(spec(nodes=2, ps=0), Addressing.per_learner_hosts("p", 2), None)
    tf_config = json.loads(plan.learners[1].env["TF_CONFIG"])
    assert tf_config == {
        "cluster": {"worker": ["p-1:2222", "p-2:2222"]},
        "task": {"type": "worker", "index": 1},
    }


def test_shared_loopback_fallback_uses_distinct_ports() -> None:
    addressing = Addressing.shared_loopback("learner-t1", 3, first_port=30000)
    plan = plan_launch(spec(nodes=3, ps=1), addressing, None)
    cluster = json.loads(plan.learners[0].env["TF_CONFIG"])["cluster"]
    assert cluster == {"ps": ["127.0.0.1:30000"], "worker": ["127.0.0.1:30001", "127.0.0.1:30002"]}
    assert [lp.hostname for lp in plan.learners] == ["learner-t1-1", "learner-t1-2", "learner-t1-3"]


@pytest.mark.parametrize("framework", ["tensorflow-horovod", "tensorflow-ddl"])
@pytest.mark.parametrize(("nodes", "gpus", "ranks"), [(2, 0, 2), (2, 1, 2), (3, 2, 6)])
def test_mpi_launch(framework: str, nodes: int, gpus: int, ranks: int) -> None:
    addressing = Addressing.per_learner_hosts("learner-t1", nodes)
    plan = plan_launch(spec(framework, nodes=nodes, gpus=gpus), addressing, MPI)
    launcher, *hosts = plan.learners
    assert launcher.role is Role.MPI_LAUNCHER and launcher.primary and launcher.waits_for_peers
    assert [h.role for h in hosts] == [Role.MPI_HOST] * (nodes - 1)
    assert not any(h.primary for h in hosts)
    argv = list(launcher.argv)
    assert argv[:5] == ["/venv/bin/mpirun", "-np", str(ranks), "--hostfile", "/work/t1/hostfile"]
    assert "plm_ssh_agent" in argv
    # No UCX: it probes /sys/class/net, which a sandbox has not, and logs ERROR lines.
    mca = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert mca["pml"] == "ob1" and mca["osc"] == "^ucx"
    # Ranks unbound: each learner is a host to mpirun, whose default binding put every
    # host's first rank on core 0 (learners sharing a machine then shared one core).
    assert argv[argv.index("--bind-to") + 1] == "none"
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"TRAINING_ID", "NUM_LEARNERS", "LEARNER_NAME_PREFIX", "GPU_COUNT"} <= exported
    tail = argv[argv.index("worker.learner.rank") - 2 :]
    assert tail[-3:] == ["/bin/sh", "-c", "python3 train.py --steps 5"]
    slots = max(gpus, 1)
    assert plan.hostfile == "".join(f"learner-t1-{i} slots={slots}\n" for i in range(1, nodes + 1))
    assert ("DDL_OPTIONS" in launcher.env) is (framework == "tensorflow-ddl")
    if framework == "tensorflow-ddl":
        assert "DDL_OPTIONS" in exported
        assert launcher.env["DDL_OPTIONS"] == f"-mode r:{slots}x{nodes}"


def test_mpi_needs_a_setup() -> None:
    with pytest.raises(ValueError, match="MPI setup"):
        plan_launch(spec("tensorflow-horovod", nodes=2), HOSTS, None)


def ffdl_spec(framework: str = "tensorflow", nodes: int = 2, ps: int = 1) -> TrainingSpec:
    return dataclasses.replace(spec(framework, nodes, ps), conventions=FFDL_CONVENTIONS)


@pytest.mark.parametrize(
    ("conventions", "hosts"),
    [
        # The platform's own: learner i at <prefix>-<i>, from 1.
        (DLAAS_CONVENTIONS, ["p-1", "p-2", "p-3"]),
        # FfDL's: learner i (LEARNER_ID i) at <prefix>-<i-1>, from 0.
        (FFDL_CONVENTIONS, ["p-0", "p-1", "p-2"]),
    ],
)
def test_host_names_by_conventions(conventions: str, hosts: list[str]) -> None:
    addressing = Addressing.per_learner_hosts("p", 3, first_host_index(conventions))
    assert list(addressing.hostnames) == hosts
    s = dataclasses.replace(spec(nodes=3, ps=1), conventions=conventions)
    plan = plan_launch(s, addressing, None)
    assert [lp.hostname for lp in plan.learners] == hosts
    assert [lp.env["LEARNER_ID"] for lp in plan.learners] == ["1", "2", "3"]
    assert plan.conventions == conventions
    cluster = json.loads(plan.learners[0].env["TF_CONFIG"])["cluster"]
    assert cluster == {"ps": [f"{hosts[0]}:2222"], "worker": [f"{h}:2222" for h in hosts[1:]]}


def test_ffdl_learners_get_ffdl_variables() -> None:
    addressing = Addressing.per_learner_hosts("learner-t1", 2, 0)
    plan = plan_launch(ffdl_spec(), addressing, None)
    ps, worker = plan.learners
    assert worker.env["PS_HOSTS_COUNT"] == "1"
    assert {k: worker.env[k] for k in ("DLAAS_JOB_ID", "DOWNWARD_API_POD_NAME")} == {
        "DLAAS_JOB_ID": "t1",
        "DOWNWARD_API_POD_NAME": "learner-t1-1",
    }
    assert ps.env["DOWNWARD_API_POD_NAME"] == "learner-t1-0"
    # The platform's own conventions add neither.
    own = plan_launch(spec(nodes=2, ps=1), Addressing.per_learner_hosts("learner-t1", 2), None)
    assert "DLAAS_JOB_ID" not in own.learners[1].env
    assert "DOWNWARD_API_POD_NAME" not in own.learners[1].env


def test_ffdl_mpi_hostfile_and_exported_variables() -> None:
    addressing = Addressing.per_learner_hosts("p", 2, 0)
    plan = plan_launch(ffdl_spec("tensorflow-horovod", 2, 0), addressing, MPI)
    assert plan.hostfile == "p-0 slots=1\np-1 slots=1\n"
    argv = plan.learners[0].argv
    assert argv[argv.index("DLAAS_JOB_ID") - 1] == "-x"


@pytest.mark.parametrize(
    ("conventions", "directories", "expected"),
    [
        (DLAAS_CONVENTIONS, {"LOG_DIR": "/job/logs"}, {}),
        (FFDL_CONVENTIONS, {"LOG_DIR": "/job/logs"}, {"JOB_STATE_DIR": "/job"}),
        (
            FFDL_CONVENTIONS,
            {"LOG_DIR": "/h/t/learner-2/logs/"},
            {"JOB_STATE_DIR": "/h/t/learner-2"},
        ),
    ],
)
def test_job_state_dir(
    conventions: str, directories: dict[str, str], expected: dict[str, str]
) -> None:
    assert convention_directories(conventions, directories) == expected
