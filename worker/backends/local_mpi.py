"""The local backend's MPI jobs (Horovod, DDL): what runs where.

With learner namespaces and a sandbox (the usual case), every process of the job is the
tenant's own and runs in a learner's sandbox:
- learner 1's command is `mpirun` (the runtime's Open MPI), started by its wrapper inside
  learner 1's namespaces and sandbox, under its limits, like any learner's command;
- mpirun's ssh agent is `<work>/mpi-agent`: the runtime's `python -I` running
  worker/learner/mpi_client.py (standard library only, bound read-only), which hands its
  standard descriptors, the host and the command to the training's relay
  (worker.learner.mpi_relay, a thread of learner 1's trusted wrapper, outside the
  sandbox) over `<work>/mpi-relay/relay.sock`. The relay starts `prted` inside that
  learner's namespaces and sandbox, with its environment and limits: a process in
  bubblewrap's user namespace cannot enter another learner's namespaces itself;
- every rank first runs worker/learner/rank.py as a file (bound read-only, the runtime's
  `python -I`) inside its learner's sandbox: the learner's variables, MODEL_DIR, the GPU
  map and, on an MPI host, its output file (bound writable); the limits are the
  sandbox's. Then it execs the tenant's command.
Each sandbox sees, besides its learner's directories and the runtime: the MPI session
directory (`<work>/mpi`, TMPDIR, writable), the hostfile, ranks.json, mpi-agent, the two
scripts and the relay's directory (read-only). The relay runs nothing outside a sandbox.

Without learner namespaces (learners share the loopback) or without a sandbox, mpirun
and its ranks' prefix run as before: the platform's processes outside the sandbox, from
`/` (PLATFORM_CWD, `--wdir`), the prefix as the platform's module (isolated: `python -I`,
its source named), which applies the learner's limits and execs the command inside the
learner's sandbox, if any.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from service.runtimes import RuntimeInfo
from service.sandbox.isolated import python_argv
from service.sandbox.limits import Enforcement
from worker.backends.netns import SUBNET, LearnerNetwork
from worker.launchers.plan import LearnerPlan, MpiSetup, Role
from worker.learner.mpi_relay import RelayHost

# Where the platform's own processes near a training run from when they run outside the
# sandbox: a directory no tenant can write to (never MODEL_DIR).
PLATFORM_CWD = "/"
_LEARNER_SOURCE = Path(__file__).resolve().parents[1] / "learner"
# Bound read-only into the sandboxes and run as files: the standard library alone.
RANK_SCRIPT = _LEARNER_SOURCE / "rank.py"
CLIENT_SCRIPT = _LEARNER_SOURCE / "mpi_client.py"


def rank_output(tdir: Path, learner_id: int) -> Path:
    """The file an MPI host's ranks write their output to; the host relays it to its log."""
    return tdir / f"learner-{learner_id}" / "rank-output"


def relay_dir(tdir: Path) -> Path:
    return tdir / "mpi-relay"


def rank_prefix_argv(ranks_path: Path) -> list[str]:
    """What every MPI rank runs first outside the sandbox (worker.learner.rank), isolated
    as the wrapper: it starts in the launcher's environment, whose HOME is a tenant's."""
    return python_argv("worker.learner.rank", str(ranks_path), "--")


def _python(runtime: RuntimeInfo | None) -> str:
    return runtime.python if runtime is not None else sys.executable


def agent_script(python: str, relay: Path) -> str:
    """mpirun's ssh agent inside the sandbox: the relay's client."""
    command = [python, "-I", str(CLIENT_SCRIPT), str(relay)]
    return f'#!/bin/sh\nexec {shlex.join(command)} "$@"\n'


def _mpirun(runtime: RuntimeInfo | None) -> str:
    # The runtime's MPI (its mpirun starts its own prted), the one its ranks' libraries
    # were built against; the platform's where the runtime is the platform's.
    if runtime is not None:
        mpirun = shutil.which("mpirun", path=runtime.bin_dir)
        if mpirun is None:
            raise RuntimeError(f"the runtime '{runtime.name}' has no mpirun")
        return mpirun
    found = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if found is None:
        raise RuntimeError("mpirun is not installed (pip install 'dlaas[mpi]')")
    return found


def mpi_setup(
    tdir: Path, net: LearnerNetwork | None, runtime: RuntimeInfo | None, *, relayed: bool
) -> MpiSetup:
    """mpirun's options and the ranks' prefix; `relayed`: mpirun runs in learner 1's
    sandbox and starts its daemons through the relay (needs `net`)."""
    options: list[str] = ["--mca", "btl", "tcp,self", "--wdir", PLATFORM_CWD]
    # Ranks run as the sandbox's unprivileged uid (service.sandbox.SANDBOX_UID), which is
    # not mpirun's where mpirun runs outside the sandbox (no learner namespaces): PMIx's
    # native check compares the uid a client states with the server's and would refuse
    # them. It was no boundary (a client may state any uid over TCP); the learner's network
    # namespace is what keeps others from the PMIx server.
    options += ["--pmixmca", "psec", "none"]
    ranks = tdir / "ranks.json"
    if net is not None:
        if relayed:
            relay_dir(tdir).mkdir(exist_ok=True)
            agent = tdir / "mpi-agent"
            agent.write_text(agent_script(_python(runtime), relay_dir(tdir)))
            agent.chmod(0o755)
        else:
            # The agent that enters the target learner (the local analogue of kubectl exec).
            agent = net.agent
        # Root inside the learners' user namespace.
        options += ["--allow-run-as-root", "--prtemca", "plm_ssh_agent", str(agent)]
        options += ["--mca", "btl_tcp_if_include", SUBNET]
        options += ["--prtemca", "oob_tcp_if_include", SUBNET]
    elif os.geteuid() == 0:
        options.append("--allow-run-as-root")
    if relayed:
        prefix = [_python(runtime), "-I", str(RANK_SCRIPT), str(ranks), "--"]
    else:
        prefix = rank_prefix_argv(ranks)
    return MpiSetup(
        mpirun=_mpirun(runtime),
        hostfile_path=str(tdir / "hostfile"),
        options=tuple(options),
        rank_prefix=tuple(prefix),
    )


def sandbox_files(tdir: Path, lp: LearnerPlan, *, relayed: bool) -> tuple[list[str], list[str]]:
    """What learner `lp`'s sandbox shows of an MPI job besides its directories:
    (read-only, writable)."""
    session = str(tdir / "mpi")
    if not relayed:
        return [], [session]
    readonly = [
        str(tdir / "hostfile"),
        str(tdir / "ranks.json"),
        str(tdir / "mpi-agent"),
        str(RANK_SCRIPT),
        str(CLIENT_SCRIPT),
        str(relay_dir(tdir)),
    ]
    writable = [session]
    if lp.role == Role.MPI_HOST:
        writable.append(str(rank_output(tdir, lp.learner_id)))
    return readonly, writable


def rank_entry(
    lp: LearnerPlan,
    tdir: Path,
    env: dict[str, str],
    sandbox: list[str],
    enforcement: Enforcement,
    *,
    relayed: bool,
) -> dict[str, Any]:
    """What a rank on learner `lp` needs (worker.learner.rank): its variables, its
    sandbox, its limits and, on an MPI host, where its output goes. mpirun would
    forward every rank's output to the launcher: the launcher's log would show each
    line of every rank (each TensorFlow start-up notice once per rank) as its own.
    Relayed, the rank is in its sandbox already, under its limits."""
    rank: dict[str, Any] = {
        "env": env,
        "prefix": [] if relayed else sandbox,
        "limits": (Enforcement() if relayed else enforcement).to_dict(),
    }
    if lp.role == Role.MPI_HOST:
        rank["output"] = str(rank_output(tdir, lp.learner_id))
    return rank


def relay_hosts(
    net: LearnerNetwork,
    plan_learners: tuple[LearnerPlan, ...],
    envs: dict[int, dict[str, str]],
    sandboxes: dict[int, list[str]],
    enforcements: dict[int, Enforcement],
) -> dict[str, dict[str, Any]]:
    """The relay's table (LocalHost.mpi_relay's hosts): how each learner's daemon starts."""
    return {
        lp.hostname: RelayHost(
            prefix=(*net.enter_argv(lp.hostname), *sandboxes[lp.learner_id]),
            env=envs[lp.learner_id],
            limits=enforcements[lp.learner_id],
        ).to_dict()
        for lp in plan_learners
    }
