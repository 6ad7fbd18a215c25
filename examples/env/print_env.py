"""Print the learner environment contract, one ``NAME=value`` line each, sorted, and exit 0.

Every variable of the contract is printed; an unset one prints as ``NAME=`` (empty), and is
also listed on the last line, ``unset=<comma-separated names>`` (empty when all are set).
Extra lines: ``cwd=<working directory>`` (should equal MODEL_DIR) and
``hostname=<socket.gethostname()>`` (should be $LEARNER_NAME_PREFIX-$LEARNER_ID where the
backend gives learners their own host names).  The whole output is sorted by name
(upper-case names first).  Newlines in values are written as ``\\n``.
"""

from __future__ import annotations

import os
import socket
import sys

CONTRACT = (
    "LEARNER_ID",
    "NUM_LEARNERS",
    "LEARNER_NAME_PREFIX",
    "TRAINING_ID",
    "MODEL_DIR",
    "DATA_DIR",
    "RESULT_DIR",
    "LOG_DIR",
    "CHECKPOINT_DIR",
    "TF_CONFIG",
    "GPU_COUNT",
    "PS_HOSTS_COUNT",
)


def main() -> int:
    values = {name: os.environ.get(name, "") for name in CONTRACT}
    values["cwd"] = os.getcwd()
    values["hostname"] = socket.gethostname()
    for name in sorted(values):
        value = values[name].replace("\n", "\\n")
        print(f"{name}={value}", flush=True)
    unset = sorted(name for name in CONTRACT if name not in os.environ)
    print(f"unset={','.join(unset)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
