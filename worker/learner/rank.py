"""The first thing every MPI rank runs: `python -I rank.py RANKS.json -- CMD...`.

mpirun starts every rank with learner 1's environment. This sets what differs by learner
(LEARNER_ID, MODEL_DIR, DATA_DIR, RESULT_DIR, ...) from RANKS.json, written by the backend:
`{"hosts": {host name: learner}, "by_rank": {rank: learner}}`, each learner
`{"env": variables, "prefix": its sandbox's argv prefix, "limits": its Enforcement}`
(by host when every learner has its own host, by rank when they share one), moves to the
learner's MODEL_DIR, maps the rank to its GPU when asked (DDL), puts itself under the
learner's resource limits and execs the command inside the learner's sandbox. A rank of
an MPI host writes its output to the file its learner names (`"output"`), which that
learner relays to its own log: through mpirun it would land in the launcher's log, where
each line every rank prints (TensorFlow's start-up notices) would show once per rank.

Where mpirun and its daemons already run in the learners' sandboxes (the local backend
with learner namespaces, worker.backends.local_mpi) the prefix is empty and the limits
are those of the sandbox the rank is in: this file then runs inside the sandbox, as a
file (bound read-only) with the runtime's `python -I`, and imports the standard library
alone. Elsewhere it runs as the platform's module, isolated, and applies the limits.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


def rank_learner(env: dict[str, str], ranks: dict[str, Any], host: str) -> dict[str, Any]:
    """The learner entry of RANKS.json a rank on `host` belongs to."""
    per_host: dict[str, dict[str, Any]] = ranks.get("hosts", {})
    by_rank: dict[str, dict[str, Any]] = ranks.get("by_rank", {})
    rank = env.get("OMPI_COMM_WORLD_RANK")
    if host in per_host:
        return per_host[host]
    if rank is not None and rank in by_rank:
        return by_rank[rank]
    raise KeyError(f"host {host!r} (rank {rank}) is not a learner of this training")


def rank_environment(env: dict[str, str], learner: dict[str, Any]) -> dict[str, str]:
    """The environment a rank of `learner` runs with."""
    out = {**env, **learner["env"]}
    # The launcher's instruction to this prefix, not the user's business.
    if out.pop("DLAAS_MAP_GPU_BY_LOCAL_RANK", None) == "1" and "OMPI_COMM_WORLD_LOCAL_RANK" in out:
        out["CUDA_VISIBLE_DEVICES"] = out["OMPI_COMM_WORLD_LOCAL_RANK"]
    return out


def _apply_limits(data: Any) -> None:
    """The learner's limits, where the rank is not already under them (a sandbox's)."""
    if not data or not any(v is not None for v in data.values()):
        return
    from service.sandbox import limits  # the platform's, only where it runs outside

    limits.apply(limits.Enforcement.from_dict(data))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m worker.learner.rank RANKS.json -- COMMAND...", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        ranks: dict[str, Any] = json.load(f)
    learner = rank_learner(dict(os.environ), ranks, socket.gethostname())
    env = rank_environment(dict(os.environ), learner)
    os.chdir(env.get("MODEL_DIR", "."))
    _apply_limits(learner.get("limits", {}))
    if output := learner.get("output"):
        fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(fd, sys.stdout.fileno())
        os.dup2(fd, sys.stderr.fileno())
        os.close(fd)
    command = [*learner.get("prefix", []), *argv[2:]]
    os.execvpe(command[0], command, env)  # noqa: S606 - the user's command, by design


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
