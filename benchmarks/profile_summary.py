"""Summarise a py-spy collapsed-stack file (`py-spy record --format raw`, as
`benchmarks.common.profiled` writes them): where the samples went.

    python benchmarks/profile_summary.py FILE [--top N] [--match TEXT ...]

Prints the share of samples per thread and process, then the functions with the largest
inclusive share (a function counted once per sample however deep it recurses) and those
with the largest self share. `--match` adds the inclusive share of every frame containing
one of the texts (e.g. `sqlalchemy`, `psycopg`, `minio`).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*?) \((?P<where>[^()]*)\)$")


def frame_label(frame: str) -> str:
    """`function (path/to/file.py:12)` as `function (file.py)`: lines merged."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    where = m["where"].rsplit(":", 1)[0]
    return f"{m['function']} ({where.rsplit('/', 1)[-1]})"


def read(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", nargs="*", default=[])
    args = parser.parse_args()
    stacks = read(args.file)
    total = sum(n for _, n in stacks) or 1
    roots: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    matched: Counter[str] = Counter()
    for frames, n in stacks:
        roots[frames[0]] += n
        labels = [frame_label(f) for f in frames[1:]] or [frames[0]]
        for label in set(labels):
            inclusive[label] += n
        own[labels[-1]] += n
        for text in args.match:
            if any(text in f for f in frames):
                matched[text] += n
    print(f"{total} samples")
    for title, counter in (("threads", roots), ("inclusive", inclusive), ("self", own)):
        print(f"-- {title}")
        for label, n in counter.most_common(args.top):
            print(f"{100 * n / total:6.1f}%  {label}")
    if matched:
        print("-- matched (inclusive)")
        for text in args.match:
            print(f"{100 * matched[text] / total:6.1f}%  {text}")


if __name__ == "__main__":
    main()
