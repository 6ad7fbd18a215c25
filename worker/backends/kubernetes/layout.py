"""Inside a learner's pod: where things are mounted, what each container runs, and the MPI
setup that matches. One owner for these paths, so the pod spec (objects.py), the learner
specs the backend writes (their directories) and the launch plan (mpirun's hostfile and
ssh options) agree.

A pod has three containers (privilege split of the learner contract):
- `fetch` (init container, platform image) reads its learner spec (with the store's
  credentials) from the training's Secret and fetches the code and data (and the last
  attempt's checkpoints, the spec's restore_checkpoints) into `work`:
  `python -I -m worker.learner.pod fetch SPEC`.
- `agent` (native sidecar, platform image, the spec mounted too) tees the command's
  output from `io` to the log store, and once the command has exited stores RESULT_DIR
  and the logs, then CHECKPOINT_DIR to the spec's checkpoints_prefix (after a stop too):
  `python -I -m worker.learner.pod agent SPEC --io IO`. The learner's phases
  are its containers' states (pod_states.py), not reports.
- `learner` (the runtime's learner image, no credentials) runs the plan's argv and leaves
  its output and exit code in `io`, then waits until the agent has stored before it exits
  with the command's code, so the pod's container state carries the learner's exit code
  and the kubelet does not stop the agent before the results are stored:
  `python -I -m worker.learner.pod run --io IO [--wait-for HOST:PORT ...] -- ARGV...`.
MPI hosts' learner containers run sshd (from the runtime image) under the same `run`.
The `run` step copies the key pair mounted at SSH_DIR (0400, owned by root) into
$HOME/.ssh with the modes ssh and sshd insist on, before the command starts.
"""

from __future__ import annotations

from service.sandbox.isolated import python_argv
from worker.launchers.plan import (
    DLAAS_CONVENTIONS,
    FFDL_CONVENTIONS,
    MpiSetup,
    convention_directories,
)

# The containers of a learner's pod.
FETCH_CONTAINER = "fetch"
AGENT_CONTAINER = "agent"
LEARNER_CONTAINER = "learner"

# The Secret's files: learner i's spec, and for MPI jobs the key pair and the hostfile.
SPEC_DIR = "/var/run/dlaas/spec"
SSH_DIR = "/var/run/dlaas/ssh"
MPI_DIR = "/var/run/dlaas/mpi"
HOSTFILE_PATH = f"{MPI_DIR}/hostfile"
# What the learner container and the agent share: the command's output and exit code.
IO_DIR = "/var/run/dlaas/io"
# The learner's directories (emptyDir `work`), the same in every pod of a training.
WORK_DIR = "/job"
DIRECTORIES = {
    "MODEL_DIR": f"{WORK_DIR}/model-code",
    "DATA_DIR": f"{WORK_DIR}/data",
    "RESULT_DIR": f"{WORK_DIR}/results",
    "LOG_DIR": f"{WORK_DIR}/logs",
    "CHECKPOINT_DIR": f"{WORK_DIR}/checkpoints",
    "HOME": f"{WORK_DIR}/home",
}
TMP_DIR = "/tmp"  # noqa: S108 - an emptyDir of its own in each container

SSH_PORT = 2022  # sshd runs as the learner's (non-root) user
SSH_KEY_NAMES = ("id_ed25519", "id_ed25519.pub", "authorized_keys")
# The runtime image's sshd configuration (no PAM, keys only); the paths that depend on the
# pod are given on the command line.
SSHD_CONFIG = "/etc/dlaas/sshd_config"
_USER_SSH = f"{DIRECTORIES['HOME']}/.ssh"

# The user and group every container runs as (the images' non-root user).
RUN_AS_USER = 1000
RUN_AS_GROUP = 1000

# The platform is installed into the images' environment: `python -I -m` finds it there
# alone, never in the working directory (MODEL_DIR), PYTHONPATH or the user site.
_POD = tuple(python_argv("worker.learner.pod", python="python", root=None))


def spec_file(learner_id: int) -> str:
    """The key of learner `learner_id`'s spec in the training's Secret."""
    return f"learner-{learner_id}.json"


def fetch_command(learner_id: int) -> list[str]:
    return [*_POD, "fetch", f"{SPEC_DIR}/{spec_file(learner_id)}"]


def agent_command(learner_id: int) -> list[str]:
    return [*_POD, "agent", f"{SPEC_DIR}/{spec_file(learner_id)}", "--io", IO_DIR]


def run_command(argv: tuple[str, ...] | list[str], wait_for: tuple[str, ...] = ()) -> list[str]:
    """The learner container's command: the wrapper's `run`, waiting for `wait_for`
    (host:port each) to accept connections first, then `argv`."""
    waits = [arg for endpoint in wait_for for arg in ("--wait-for", endpoint)]
    return [*_POD, "run", "--io", IO_DIR, *waits, "--", *argv]


def sshd_argv() -> tuple[str, ...]:
    """What an MPI host runs: the runtime image's sshd, in the foreground, logging to
    stderr, with the training's key pair as host key and authorized key."""
    return (
        "/usr/sbin/sshd",
        "-D",
        "-e",
        "-f",
        SSHD_CONFIG,
        "-p",
        str(SSH_PORT),
        "-o",
        f"HostKey={_USER_SSH}/id_ed25519",
        "-o",
        f"AuthorizedKeysFile={_USER_SSH}/authorized_keys",
        "-o",
        "PidFile=none",
    )


# Where a rank of an MPI host writes its output, which the host relays as its own: through
# mpirun it would land in the launcher's log, where each line every rank prints (each
# TensorFlow start-up notice) would show once per rank.
RANK_OUTPUT = f"{TMP_DIR}/dlaas-rank-output"

# A rank started over ssh gets sshd's environment, not the pod's: its learner's id comes
# from the host name (`<prefix>-<i>`), its directories are the same in every pod; the
# shared variables come from mpirun (-x). Learner 1 is the launcher (its ranks' output is
# mpirun's), the others are hosts.
_RANK_SCRIPT = (
    'h="$(hostname)"; export LEARNER_ID="${h##*-}" '
    + " ".join(f"{name}={path}" for name, path in DIRECTORIES.items())
    + f'; [ "$LEARNER_ID" = 1 ] || exec >>{RANK_OUTPUT} 2>&1'
    + '; cd "$MODEL_DIR" && exec "$@"'
)
# Under FfDL's conventions learner i's host is `<prefix>-<i-1>`, and JOB_STATE_DIR is set.
_FFDL_RANK_SCRIPT = (
    'h="$(hostname)"; export LEARNER_ID="$((${h##*-} + 1))" '
    + " ".join(
        f"{name}={path}"
        for name, path in {
            **DIRECTORIES,
            **convention_directories(FFDL_CONVENTIONS, DIRECTORIES),
        }.items()
    )
    + f'; [ "$LEARNER_ID" = 1 ] || exec >>{RANK_OUTPUT} 2>&1'
    + '; cd "$MODEL_DIR" && exec "$@"'
)


def mpi_host_argv() -> tuple[str, ...]:
    """An MPI host's learner container: sshd, which the launcher's mpirun starts ranks
    through, and beside it the relay of those ranks' output (RANK_OUTPUT) to the
    container's, which the agent sends to the learner's log."""
    relay = f': > {RANK_OUTPUT}; tail -n +1 -f {RANK_OUTPUT} & exec "$@"'
    return ("/bin/sh", "-c", relay, "dlaas-host", *sshd_argv())


def mpi_setup(conventions: str = DLAAS_CONVENTIONS) -> MpiSetup:
    """The MPI setup of a training on Kubernetes: the runtime image's mpirun, its daemons
    started over ssh (the training's key, sshd on SSH_PORT), TCP between pods; each rank
    finds its learner by its host's name, as `conventions` name hosts."""
    script = _FFDL_RANK_SCRIPT if conventions == FFDL_CONVENTIONS else _RANK_SCRIPT
    ssh_args = (
        f"-p {SSH_PORT} -i {_USER_SSH}/id_ed25519 "
        "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    )
    return MpiSetup(
        mpirun="mpirun",
        hostfile_path=HOSTFILE_PATH,
        options=("--mca", "btl", "tcp,self", "--prtemca", "plm_ssh_args", ssh_args),
        rank_prefix=("/bin/sh", "-c", script, "dlaas-rank"),
    )
