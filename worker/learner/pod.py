"""A learner's steps inside its pod (worker.backends.kubernetes.layout names the commands):

    python -m worker.learner.pod fetch SPEC             # init container, platform image
    python -m worker.learner.pod agent SPEC --io IO     # native sidecar, platform image
    python -m worker.learner.pod run --io IO [--wait-for HOST:PORT ...] -- ARGV...
                                                        # learner container, runtime image

`fetch` and `agent` hold the spec's credentials (worker.learner.pod_steps); `run` holds
none and runs in the runtime's image, so this module and `run`'s (worker.learner.pod_run)
import only the standard library (the `pod-run` contract in pyproject.toml):
worker.learner.pod_steps is imported when fetch or agent is asked for.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from worker.learner import pod_io, pod_run

EXIT_USAGE = 2


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--termination-log",
        default=pod_io.TERMINATION_LOG,
        help="where a failure's reason goes (the pod's terminationMessagePath)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker.learner.pod")
    steps = parser.add_subparsers(dest="step", required=True)
    fetch = steps.add_parser("fetch", help="fetch the code and data into the learner's dirs")
    agent = steps.add_parser("agent", help="send the output to the log store, then store")
    for step in (fetch, agent):
        step.add_argument("spec", type=Path, help="the learner's spec (JSON)")
        step.add_argument("--private-dir", type=Path, help="the step's own files (default: /tmp)")
        _common(step)
    agent.add_argument("--io", type=Path, required=True, help="the volume shared with run")
    run = steps.add_parser("run", help="run the command: run --io IO [...] -- ARGV...")
    run.add_argument("--io", type=Path, required=True, help="the volume shared with the agent")
    run.add_argument("--wait-for", action="append", default=[], metavar="HOST:PORT")
    run.add_argument("--wait-timeout", type=float, default=None, metavar="SECONDS")
    run.add_argument("--store-timeout", type=float, default=None, metavar="SECONDS")
    run.add_argument("--grace", type=float, default=None, metavar="SECONDS")
    run.add_argument("--ssh-dir", type=Path, default=None)
    run.add_argument("--segment-bytes", type=int, default=None, help=argparse.SUPPRESS)
    _common(run)
    return parser


class UsageError(Exception):
    pass


def parse(args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The step's options and, for `run`, the command after `--`; UsageError if wrong."""
    command: list[str] = []
    if args[:1] == ["run"]:
        if "--" not in args:
            raise UsageError("usage: python -m worker.learner.pod run --io IO ... -- ARGV...")
        split = args.index("--")
        args, command = args[:split], args[split + 1 :]
        if not command:
            raise UsageError("worker.learner.pod run: no command after --")
    try:
        ns = _parser().parse_args(args)
    except SystemExit as e:  # argparse has printed why
        raise UsageError("") from e
    for endpoint in getattr(ns, "wait_for", []):
        try:
            pod_run.parse_endpoint(endpoint)
        except ValueError as e:
            raise UsageError(f"worker.learner.pod run: {e}") from e
    return ns, command


def main(argv: Sequence[str] | None = None) -> int:
    """Run one step; returns its exit code."""
    try:
        ns, command = parse(list(sys.argv[1:] if argv is None else argv))
    except UsageError as e:
        if str(e):
            print(e, file=sys.stderr)
        return EXIT_USAGE
    if ns.step == "run":
        options = pod_run.RunOptions(io_dir=ns.io, argv=command, wait_for=tuple(ns.wait_for))
        overrides: dict[str, Any] = {
            "wait_timeout": ns.wait_timeout,
            "store_timeout": ns.store_timeout,
            "grace": ns.grace,
            "ssh_dir": ns.ssh_dir,
            "segment_bytes": ns.segment_bytes,
            "termination_log": ns.termination_log,
        }
        options = replace(options, **{k: v for k, v in overrides.items() if v is not None})
        return pod_run.run(options)

    from worker.learner import pod_steps

    private_dir = ns.private_dir or pod_steps.default_private_dir()
    if ns.step == "fetch":
        return pod_steps.fetch(ns.spec, private_dir, ns.termination_log)
    return pod_steps.agent(ns.spec, ns.io, private_dir, ns.termination_log)


if __name__ == "__main__":
    sys.exit(main())
