"""PyTorch's launch plans (worker/launchers/torchrun.py), table-driven: every learner's
torchrun, its rendezvous, and the user's command as torchrun takes it."""

from __future__ import annotations

import pytest

from service.domain.catalog import DEFAULT_CATALOG
from service.domain.lifecycle import LearnerObservation, decide
from service.domain.states import TrainingState
from worker.launchers import plan_launch
from worker.launchers.plan import Addressing, Role, TrainingSpec
from worker.launchers.torchrun import rendezvous_endpoint, script_argv


def spec(
    command: str = "python train.py --epochs 3", nodes: int = 2, gpus: int = 0
) -> TrainingSpec:
    return TrainingSpec(
        training_id="t1",
        framework="pytorch",
        version="2.13",
        command=command,
        nodes=nodes,
        gpus_per_node=gpus,
        distribution="torchrun",
    )


def test_the_catalog_launches_pytorch_with_torchrun_and_pytorch_ddl_under_mpirun() -> None:
    assert DEFAULT_CATALOG.frameworks["pytorch"].distribution == "torchrun"
    assert DEFAULT_CATALOG.frameworks["pytorch-ddl"].distribution == "mpi"
    assert DEFAULT_CATALOG.runtime("pytorch", "2.13") == "pytorch2.13"
    assert DEFAULT_CATALOG.runtime("pytorch-ddl", "2.13") == "pytorch2.13"
    assert not DEFAULT_CATALOG.native_tensorflow("pytorch")


@pytest.mark.parametrize(
    ("nodes", "gpus", "learner", "flags"),
    [
        (
            2,
            0,
            1,
            "--nnodes=2 --node_rank=0 --nproc_per_node=1 --rdzv_backend=static "
            "--rdzv_endpoint=learner-t1-1:29400 --max_restarts=0",
        ),
        (
            2,
            0,
            2,
            "--nnodes=2 --node_rank=1 --nproc_per_node=1 --rdzv_backend=static "
            "--rdzv_endpoint=learner-t1-1:29400 --max_restarts=0",
        ),
        (
            3,
            2,
            3,
            "--nnodes=3 --node_rank=2 --nproc_per_node=2 --rdzv_backend=static "
            "--rdzv_endpoint=learner-t1-1:29400 --max_restarts=0",
        ),
        (
            1,
            4,
            1,
            "--nnodes=1 --node_rank=0 --nproc_per_node=4 --rdzv_backend=static "
            "--rdzv_endpoint=learner-t1-1:29400 --max_restarts=0",
        ),
    ],
)
def test_every_learner_runs_torchrun_with_a_static_rendezvous_on_learner_1(
    nodes: int, gpus: int, learner: int, flags: str
) -> None:
    plan = plan_launch(
        spec(nodes=nodes, gpus=gpus), Addressing.per_learner_hosts("learner-t1", nodes), None
    )
    lp = plan.learners[learner - 1]
    assert lp.argv == ("torchrun", *flags.split(), "train.py", "--epochs", "3")
    assert lp.env["LEARNER_ID"] == str(learner) and lp.env["NUM_LEARNERS"] == str(nodes)
    assert lp.env["LEARNER_NAME_PREFIX"] == "learner-t1"
    assert not lp.waits_for_peers  # the static rendezvous waits for them itself
    # Completion: every learner's torchrun exited 0.
    assert plan.primaries == tuple(range(1, nodes + 1))
    assert {lp.role for lp in plan.learners} == {Role.SINGLE if nodes == 1 else Role.WORKER}


def test_on_a_shared_loopback_the_rendezvous_is_learner_1s_port() -> None:
    shared = Addressing.shared_loopback("learner-t1", 2, 41000)
    assert rendezvous_endpoint(shared) == "127.0.0.1:41000"
    plan = plan_launch(spec(), shared, None)
    assert all("--rdzv_endpoint=127.0.0.1:41000" in lp.argv for lp in plan.learners)


@pytest.mark.parametrize(
    ("command", "script", "unbuffered"),
    [
        ("python train.py --x 1", ("train.py", "--x", "1"), False),
        ("python3 -u train.py", ("train.py",), True),
        ("python3.11 src/train.py 'a b'", ("src/train.py", "a b"), False),
        ("python -m pkg.train --lr 0.1", ("-m", "pkg.train", "--lr", "0.1"), False),
        # A shell line: every process torchrun starts runs it through /bin/sh.
        (
            "cd src && python train.py",
            ("--no-python", "/bin/sh", "-c", "cd src && python train.py"),
            False,
        ),
        (
            "EPOCHS=2 python train.py",
            ("--no-python", "/bin/sh", "-c", "EPOCHS=2 python train.py"),
            False,
        ),
        (
            "python train.py --out $RESULT_DIR",
            ("--no-python", "/bin/sh", "-c", "python train.py --out $RESULT_DIR"),
            False,
        ),
        ("./train.sh", ("--no-python", "/bin/sh", "-c", "./train.sh"), False),
        ("python -c 'print(1)'", ("--no-python", "/bin/sh", "-c", "python -c 'print(1)'"), False),
        ("python 'unclosed", ("--no-python", "/bin/sh", "-c", "python 'unclosed"), False),
        ("python", ("--no-python", "/bin/sh", "-c", "python"), False),
    ],
)
def test_the_users_command_as_torchrun_takes_it(
    command: str, script: tuple[str, ...], unbuffered: bool
) -> None:
    assert script_argv(command) == (script, unbuffered)
    (lp,) = plan_launch(spec(command, nodes=1), Addressing.per_learner_hosts("p", 1), None).learners
    assert lp.argv[-len(script) :] == script
    assert (lp.env.get("PYTHONUNBUFFERED") == "1") is unbuffered


def test_the_training_completes_only_when_every_learners_torchrun_exited_0() -> None:
    primaries = plan_launch(spec(), Addressing.per_learner_hosts("p", 2), None).primaries
    now = __import__("datetime").datetime(2026, 1, 1)

    def state(*phases: str) -> TrainingState | None:
        learners = [
            LearnerObservation(i, p, 0 if p == "COMPLETED" else None)
            for i, p in enumerate(phases, 1)
        ]
        return decide(
            TrainingState.RUNNING,
            learners,
            primaries,
            stop_requested=False,
            started_at=None,
            max_runtime=None,
            now=now,
        ).state

    assert state("COMPLETED", "RUNNING") is None
    assert state("RUNNING", "COMPLETED") is None
    assert state("COMPLETED", "COMPLETED") == TrainingState.COMPLETED
    assert state("COMPLETED", "FAILED") == TrainingState.FAILED
