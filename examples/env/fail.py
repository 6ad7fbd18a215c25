"""Print one line and exit with the code given as the first argument (default 3)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    code = int(argv[1]) if len(argv) > 1 else 3
    print(f"fail.py: exiting with code {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
