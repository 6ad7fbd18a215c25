"""Open MPI ssh agent that runs a command inside a learner's namespaces instead of over ssh.

Usage: ``python -m worker.backends.netns_agent <state_dir> [ssh options] <host> <command...>``
(``LearnerNetwork`` writes ``<state_dir>/mpi-agent``, a wrapper with the state dir baked in, for
``--prtemca plm_ssh_agent``).  Like ssh, the command words are joined with spaces and run by
``$SHELL -c`` (PRRTE builds the daemon command for the local shell); unlike ssh, the environment
and working directory are kept.  ssh options before the host (``-x``, ``-T``, ``-o opt`` ...) are
accepted and ignored.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from worker.backends.netns import LearnerNetwork

_WITH_VALUE = frozenset("bcDEeFIiJLlmOopQRSWw")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        print("usage: netns_agent <state_dir> [ssh options] <host> <command...>", file=sys.stderr)
        return 255
    state_dir = Path(args.pop(0))
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt == "--":
            break
        if len(opt) == 2 and opt[1] in _WITH_VALUE and args:
            args.pop(0)
    if len(args) < 2:
        print("netns_agent: missing host or command", file=sys.stderr)
        return 255
    host, command = args[0], " ".join(args[1:])
    net = LearnerNetwork.attach(state_dir)
    if net is None or host not in net.pids:
        print(f"netns_agent: no learner {host!r} in {state_dir}", file=sys.stderr)
        return 255
    shell = os.environ.get("SHELL") or "/bin/sh"
    argv_ = [*net.enter_argv(host), shell, "-c", command]
    os.execvp(argv_[0], argv_)  # noqa: S606


if __name__ == "__main__":
    sys.exit(main())
