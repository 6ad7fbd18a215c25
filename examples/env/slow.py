"""Print ``tick=<i> loss=<v>`` every --interval seconds (0.25) for --seconds seconds (5).

For log-follow, metrics and stop tests: the lines are deterministic (i = 0, 1, ...;
loss = 1 / (i + 1), written with Python's repr, so ``float(v) == 1 / (i + 1)``) and there are
exactly round(seconds / interval) of them, then ``done ticks=<n>`` once --seconds have passed.
Lines are flushed as they are printed and scheduled against a monotonic clock (no drift).
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args(argv)
    ticks = max(round(args.seconds / args.interval), 0)
    start = time.monotonic()
    for i in range(ticks):
        print(f"tick={i} loss={1 / (i + 1)!r}", flush=True)
        time.sleep(max(start + (i + 1) * args.interval - time.monotonic(), 0.0))
    print(f"done ticks={ticks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
