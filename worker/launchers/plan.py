"""The launch plan: what every learner of a training runs, with which environment.

Launchers are pure functions from a training (and how its learners are addressed) to a
LaunchPlan. Backends add what only they know (directories, process or pod details).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from service.domain.names import DNS_LABEL_MAX, dns_label

GRPC_PORT = 2222
# How learners are named and what they are told (the manifest's `conventions`): the
# platform's own, learner i at `<prefix>-<i>` from 1; or FfDL's, learner i at
# `<prefix>-<i-1>` (from 0; LEARNER_ID is still i) with FfDL's further variables.
DLAAS_CONVENTIONS = "dlaas"
FFDL_CONVENTIONS = "ffdl"
# Learner i's host name is `<prefix>-<i>`, a DNS label too: the prefix leaves room for
# learner ids of up to five digits.
LEARNER_NAME_PREFIX_MAX = DNS_LABEL_MAX - 6


def learner_name_prefix(training_id: str) -> str:
    """$LEARNER_NAME_PREFIX of a training: `learner-<id>`, a DNS label (lowercase, at most
    57 characters, stable for the training) whichever backend runs it. It names the
    learners' hosts, and on Kubernetes the training's headless Service and pods."""
    return dns_label(f"learner-{training_id}", LEARNER_NAME_PREFIX_MAX)


class Role(StrEnum):
    SINGLE = "single"
    PARAMETER_SERVER = "ps"
    WORKER = "worker"
    MPI_LAUNCHER = "mpi-launcher"
    MPI_HOST = "mpi-host"


@dataclass(frozen=True)
class TrainingSpec:
    """What a launcher needs to know of a training."""

    training_id: str
    framework: str
    version: str
    command: str
    nodes: int
    parameter_servers: int = 0
    gpus_per_node: int = 0
    # From the framework catalog: "parameter_server", "mpi" or "torchrun".
    distribution: str = "parameter_server"
    # The compute configuration's resources per learner (0: not limited).
    cpus: int = 0
    memory_gib: int = 0
    conventions: str = DLAAS_CONVENTIONS


def first_host_index(conventions: str) -> int:
    """The number in the first learner's host name: 0 under FfDL's conventions, else 1."""
    return 0 if conventions == FFDL_CONVENTIONS else 1


@dataclass(frozen=True)
class Addressing:
    """How learners reach each other: learner i (1-based) at hosts[i-1]:ports[i-1].

    With one network namespace per learner every learner has its own host name and port
    2222; without, they share 127.0.0.1 on distinct ports.
    """

    prefix: str
    hostnames: tuple[str, ...]
    hosts: tuple[str, ...]
    ports: tuple[int, ...]

    @staticmethod
    def host_names(prefix: str, nodes: int, first: int = 1) -> tuple[str, ...]:
        """Learner i's host name, for i in 1..nodes: `<prefix>-<i - 1 + first>`."""
        return tuple(f"{prefix}-{i - 1 + first}" for i in range(1, nodes + 1))

    @classmethod
    def per_learner_hosts(cls, prefix: str, nodes: int, first: int = 1) -> Addressing:
        names = cls.host_names(prefix, nodes, first)
        return cls(prefix, names, names, (GRPC_PORT,) * nodes)

    @classmethod
    def shared_loopback(
        cls, prefix: str, nodes: int, first_port: int, first: int = 1
    ) -> Addressing:
        names = cls.host_names(prefix, nodes, first)
        ports = tuple(first_port + i for i in range(nodes))
        return cls(prefix, names, ("127.0.0.1",) * nodes, ports)

    def endpoint(self, learner_id: int) -> str:
        return f"{self.hosts[learner_id - 1]}:{self.ports[learner_id - 1]}"


@dataclass(frozen=True)
class MpiSetup:
    """What an MPI launch needs from the backend."""

    mpirun: str
    hostfile_path: str
    # Backend-specific mpirun options: how remote daemons start, which interfaces to use.
    options: tuple[str, ...] = ()
    # argv prefix every rank runs first; it fixes up the rank's learner environment.
    rank_prefix: tuple[str, ...] = ()


@dataclass(frozen=True)
class LearnerPlan:
    learner_id: int
    hostname: str
    role: Role
    # The training completes when every primary learner has exited 0; the others
    # (parameter servers, MPI hosts) never exit on their own and are then stopped.
    primary: bool
    argv: tuple[str, ...]
    env: dict[str, str]
    # MPI launcher: wait until every learner has its code in place before mpirun.
    waits_for_peers: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    training_id: str
    learners: tuple[LearnerPlan, ...]
    hostfile: str | None = None  # MPI: the content of MpiSetup.hostfile_path
    conventions: str = DLAAS_CONVENTIONS

    @property
    def primaries(self) -> tuple[int, ...]:
        return tuple(lp.learner_id for lp in self.learners if lp.primary)


def base_env(spec: TrainingSpec, addressing: Addressing, learner_id: int) -> dict[str, str]:
    """The part of the learner environment every framework shares; under FfDL's
    conventions also FfDL's DLAAS_JOB_ID (the training's id) and DOWNWARD_API_POD_NAME
    (the learner's host name, its pod's name on Kubernetes)."""
    env = {
        "TRAINING_ID": spec.training_id,
        "LEARNER_ID": str(learner_id),
        "NUM_LEARNERS": str(spec.nodes),
        "LEARNER_NAME_PREFIX": addressing.prefix,
        "GPU_COUNT": str(spec.gpus_per_node),
    }
    if spec.conventions == FFDL_CONVENTIONS:
        env["DLAAS_JOB_ID"] = spec.training_id
        env["DOWNWARD_API_POD_NAME"] = addressing.hostnames[learner_id - 1]
    return env


def convention_directories(conventions: str, directories: Mapping[str, str]) -> dict[str, str]:
    """The directory variables a backend adds to the learner's (`directories`: MODEL_DIR,
    LOG_DIR...) under `conventions`: FfDL's JOB_STATE_DIR, the directory LOG_DIR is `logs`
    of (FfDL's `$JOB_STATE_DIR/logs`), under FfDL's; none under the platform's."""
    if conventions != FFDL_CONVENTIONS:
        return {}
    return {"JOB_STATE_DIR": posixpath.dirname(directories["LOG_DIR"].rstrip("/"))}


def shell(command: str) -> tuple[str, ...]:
    """The user's command as the manifest gives it: one shell command line."""
    return ("/bin/sh", "-c", command)


# Before the command in a learner's shell: a SIGTERM (which the learner sends the whole
# process group on a stop) waits for the program running in the foreground, then ends the
# shell as the signal would have. A shell without it dies of the signal at once, and with
# it a sandbox's PID namespace, which SIGKILLs the program before its own handler (a last
# checkpoint in its grace period) has run. The program gets the signal itself (a trap's
# action is not inherited), so one without a handler still ends at once.
STOP_TRAP = "trap 'trap - TERM; kill -TERM $$' TERM; "


def learner_shell(command: str) -> tuple[str, ...]:
    """`shell` for a command the learner's supervision stops (worker.learner.supervision):
    its programs get their grace period (STOP_TRAP)."""
    return ("/bin/sh", "-c", STOP_TRAP + command)
