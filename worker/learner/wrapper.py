"""The learner wrapper: the trusted part of every learner (a local process or a pod's
container), `python -m worker.learner SPEC HOST`.

SPEC is the learner contract every backend shares (worker.learner.spec: what to fetch,
run and store; mode 0600, it holds the credentials). HOST is what the backend supplies
(worker.learner.host: how to report the status, meet the peers, enter the sandbox).
The wrapper fetches the code and the training data (worker.learner.transfers), runs the
user's command in the backend's sandbox and tees its output (worker.learner.supervision,
worker.learner.logtee), stores results and logs, and reports every phase
(worker.learner.status); the phase machine is worker.learner.phases.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

from worker.learner.host import LocalHost
from worker.learner.phases import EXIT_PLATFORM_ERROR, Learner
from worker.learner.spec import LearnerSpec


def run_learner(spec: LearnerSpec, host: LocalHost) -> int:
    """Run one learner to its end; returns the wrapper's exit code (see phases). An MPI
    launcher serves its training's relay (worker.learner.mpi_relay) meanwhile."""
    relay = host.relay()
    serving = relay.serving() if relay is not None else contextlib.nullcontext()
    with serving:
        return _run(spec, host)


def _run(spec: LearnerSpec, host: LocalHost) -> int:
    learner = Learner(
        spec,
        reporter=host.reporter(spec.training_id),
        rendezvous=host.rendezvous(),
        private_dir=Path(host.private_dir),
        run_prefix=host.run_prefix,
        enforcement=host.limits,
    )
    return learner.run()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m worker.learner SPEC HOST`; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m worker.learner SPEC.json HOST.json", file=sys.stderr)
        return EXIT_PLATFORM_ERROR
    try:
        spec = LearnerSpec.read(Path(args[0]))
    except (OSError, ValueError) as e:
        print(f"learner wrapper: cannot read the learner spec {args[0]}: {e}", file=sys.stderr)
        return EXIT_PLATFORM_ERROR
    try:
        host = LocalHost.read(Path(args[1]))
        host.relay()
    except (OSError, ValueError) as e:
        print(f"learner wrapper: cannot read the learner host {args[1]}: {e}", file=sys.stderr)
        return EXIT_PLATFORM_ERROR
    return run_learner(spec, host)
