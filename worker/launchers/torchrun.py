"""PyTorch: every learner runs `torchrun`, with a static c10d rendezvous on learner 1.

Learner i runs `torchrun --nnodes=N --node_rank=i-1 --nproc_per_node=G --rdzv_backend=static
--rdzv_endpoint=<prefix>-1:29400 ...` (G = GPUs per node, 1 on a CPU-only configuration):
torchrun starts G processes, each with MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK and friends set, so `torch.distributed.init_process_group()` needs no argument
(without one it uses Gloo for CPU tensors and NCCL for CUDA ones); learner 1's torchrun
serves the rendezvous store on port 29400.

The user's command is their training script, as they run it on one machine. A command of
the form `python [-u] script.py args...` (or `python -m module args...`) becomes `torchrun
<flags> [-m] script.py args...` (torchrun runs it with the runtime's Python); any other
command line (`cd src && python train.py`, a shell script) runs as `torchrun <flags>
--no-python /bin/sh -c '<command>'`, so every process torchrun starts runs the line with
the same variables set. No command is refused.

Every learner is primary: the training completes when every learner's torchrun has exited
0 (torchrun exits 0 once all its processes have), and fails as soon as one exits non-zero
(torchrun's own restarts are off: `--max_restarts=0`; the platform's retry_policy is the
one way to run again).
"""

from __future__ import annotations

import re
import shlex

from worker.launchers.plan import (
    Addressing,
    LaunchPlan,
    LearnerPlan,
    Role,
    TrainingSpec,
    base_env,
)

TORCHRUN = "torchrun"
# torchrun's default rendezvous port (c10d's TCPStore on learner 1).
RENDEZVOUS_PORT = 29400
# A Python interpreter as a training command names it: python, python3, python3.11.
_PYTHON = re.compile(r"python(3(\.\d+)?)?")
# Interpreter flags torchrun's `python` can take: unbuffered output only (torchrun runs its
# children with the runtime's Python; `-u` is passed as PYTHONUNBUFFERED instead).
_UNBUFFERED = "-u"


def rendezvous_endpoint(addressing: Addressing) -> str:
    """Learner 1's rendezvous address: `<prefix>-1:29400` where every learner has a host of
    its own; where learners share the loopback (no namespaces), learner 1's port there."""
    if addressing.hosts == addressing.hostnames:
        return f"{addressing.hostnames[0]}:{RENDEZVOUS_PORT}"
    return addressing.endpoint(1)


def script_argv(command: str) -> tuple[tuple[str, ...], bool]:
    """What follows torchrun's own flags for the user's `command`, and whether its output
    should be unbuffered (`python -u`). A plain `python [-u] script args` or `python [-u]
    -m module args` gives `script args` or `-m module args`; anything else `--no-python
    /bin/sh -c command`."""
    try:
        words = shlex.split(command, posix=True)
    except ValueError:
        words = []
    plain = bool(words) and not _has_shell_syntax(command)
    if plain and _PYTHON.fullmatch(words[0]):
        rest = words[1:]
        unbuffered = False
        while rest and rest[0] == _UNBUFFERED:
            unbuffered = True
            rest = rest[1:]
        if rest and rest[0] == "-m" and len(rest) > 1:
            return ("-m", *rest[1:]), unbuffered
        if rest and not rest[0].startswith("-"):
            return tuple(rest), unbuffered
    return ("--no-python", "/bin/sh", "-c", command), False


def _has_shell_syntax(command: str) -> bool:
    """Whether the line needs a shell: operators, redirections, substitutions, variables,
    globs or an assignment before the command."""
    if any(c in command for c in ";&|<>`$(){}*?[]~\n"):
        return True
    first = command.strip().split(maxsplit=1)[0] if command.strip() else ""
    return "=" in first


def torchrun_flags(spec: TrainingSpec, addressing: Addressing, learner_id: int) -> tuple[str, ...]:
    return (
        f"--nnodes={spec.nodes}",
        f"--node_rank={learner_id - 1}",
        f"--nproc_per_node={max(spec.gpus_per_node, 1)}",
        "--rdzv_backend=static",
        f"--rdzv_endpoint={rendezvous_endpoint(addressing)}",
        "--max_restarts=0",
    )


def plan_torchrun(spec: TrainingSpec, addressing: Addressing) -> LaunchPlan:
    script, unbuffered = script_argv(spec.command)
    learners = []
    for i in range(1, spec.nodes + 1):
        env = base_env(spec, addressing, i)
        if unbuffered:
            env["PYTHONUNBUFFERED"] = "1"
        learners.append(
            LearnerPlan(
                learner_id=i,
                hostname=addressing.hostnames[i - 1],
                role=Role.SINGLE if spec.nodes == 1 else Role.WORKER,
                primary=True,
                argv=(TORCHRUN, *torchrun_flags(spec, addressing, i), *script),
                env=env,
            )
        )
    return LaunchPlan(spec.training_id, tuple(learners))
