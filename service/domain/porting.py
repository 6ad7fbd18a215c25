"""What a TensorFlow 1.x script needs ported to run here, recognised in its output. Pure.

TensorFlow 1.x cannot run on Python 3.11: the catalog's "1.5" runs on TensorFlow 2, where
the 1.x API is `tf.compat.v1` and `tf.contrib` and `tensorflow.examples.tutorials` are
gone. An FfDL-era script that imports them fails at once with ModuleNotFoundError (or, for
`tf.contrib.*` reached as an attribute, AttributeError); the failed training's message says
so and points to the README's porting notes (`porting_note`), rather than leaving the user
with an exit code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# The README section the message points to.
PORTING_NOTES = "README.md, 'Porting TensorFlow 1.x scripts'"
# How many of a failed training's first log lines are looked at: an import fails first.
LINES_READ = 2_000

_MISSING = re.compile(
    r"ModuleNotFoundError: No module named '(?P<module>tensorflow\.(?:contrib|examples)[\w.]*)'"
    r"|AttributeError: module 'tensorflow(?:\.compat\.v1)?' has no attribute '(?P<attr>contrib)'"
)


def runs_tensorflow1_scripts(framework_version: str) -> bool:
    """Whether trainings of this catalog version are TensorFlow 1.x scripts (run on
    TensorFlow 2 through tf.compat.v1): the "1.x" versions."""
    return framework_version.split(".")[0] == "1"


def porting_note(framework_version: str, lines: Iterable[str]) -> str | None:
    """What to add to the failure message of a training of `framework_version` whose
    log holds `lines`: why a TensorFlow 1.x import failed and where the porting notes are;
    None when the version is not a 1.x one or no such failure is in the lines."""
    if not runs_tensorflow1_scripts(framework_version):
        return None
    for line in lines:
        found = _MISSING.search(line)
        if found is None:
            continue
        module = found["module"] or "tensorflow.contrib"
        return (
            f"the script imports {module}, which TensorFlow 1.x had and the "
            f'"{framework_version}" runtime does not: TensorFlow 1.x cannot run on Python 3.11, '
            f'so "{framework_version}" scripts run on TensorFlow 2 through tf.compat.v1, '
            "without tf.contrib and tensorflow.examples.tutorials; port it as "
            f"{PORTING_NOTES} shows (tf.compat.v1, replacements for tf.contrib.layers and "
            "input_data)"
        )
    return None
