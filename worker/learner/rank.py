"""The first thing every MPI rank runs: `python -m worker.learner.rank RANKS.json -- CMD...`.

mpirun starts every rank with learner 1's environment. This sets what differs by learner
(LEARNER_ID, MODEL_DIR, DATA_DIR, RESULT_DIR, ...) from RANKS.json, written by the backend:
`{"hosts": {host name: variables}, "by_rank": {rank: variables}}` (by host when every
learner has its own host, by rank when they share one), moves to the learner's MODEL_DIR,
maps the rank to its GPU when asked (DDL), and execs the command.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


def rank_environment(env: dict[str, str], ranks: dict[str, Any], host: str) -> dict[str, str]:
    """The environment a rank on `host` runs with."""
    per_host: dict[str, dict[str, str]] = ranks.get("hosts", {})
    by_rank: dict[str, dict[str, str]] = ranks.get("by_rank", {})
    rank = env.get("OMPI_COMM_WORLD_RANK")
    if host in per_host:
        learner = per_host[host]
    elif rank is not None and rank in by_rank:
        learner = by_rank[rank]
    else:
        raise KeyError(f"host {host!r} (rank {rank}) is not a learner of this training")
    out = {**env, **learner}
    if out.get("DLAAS_MAP_GPU_BY_LOCAL_RANK") == "1" and "OMPI_COMM_WORLD_LOCAL_RANK" in out:
        out["CUDA_VISIBLE_DEVICES"] = out["OMPI_COMM_WORLD_LOCAL_RANK"]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m worker.learner.rank RANKS.json -- COMMAND...", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        ranks: dict[str, Any] = json.load(f)
    env = rank_environment(dict(os.environ), ranks, socket.gethostname())
    os.chdir(env.get("MODEL_DIR", "."))
    os.execvpe(argv[2], argv[2:], env)  # noqa: S606 - the user's command, by design


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
