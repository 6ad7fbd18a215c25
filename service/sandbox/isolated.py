"""How the platform starts its own Python near tenants' files: isolated, from its own source.

Whenever the platform runs one of its modules in a place a tenant's files can reach (the
learner wrapper, the MPI ranks' prefix, the MPI agent, a learner pod's steps, the model
process), Python's start-up must import nothing from there. A plain `python -m MOD` puts
its working directory first on `sys.path` (a code archive's `worker/learner/rank.py`
would run in the rank prefix's place), reads `PYTHONPATH`, `PYTHONSTARTUP` and
`PYTHONHOME` from the environment, and the user site directory (`~/.local/lib/pythonX.Y/
site-packages`, its `.pth` files and `usercustomize`) under a tenant-writable `$HOME`.

`python_argv` builds the one form every such process starts with: `python -I` (no
environment variables, no user site directory and, since Python 3.11, no working or
script directory on the path) that puts the platform's source root first on `sys.path`
explicitly and runs the module as `-m` would (`runpy.run_module`, `alter_sys=True`).
Where the platform is installed into the interpreter's environment (a learner image) no
root is given: `python -I -m MOD` finds it in the environment's site-packages alone.

The standard library only, and nothing else of the platform: the pod's learner container
imports it through `worker.backends.kubernetes.layout` in the runtime's image.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The directory holding the platform's packages (`service`, `worker`, ...): a checkout's
# root, or the site-packages it is installed in.
PLATFORM_ROOT = str(Path(__file__).resolve().parents[2])


def bootstrap(module: str, root: str = PLATFORM_ROOT) -> str:
    """The `-c` program that runs `module` as `__main__` from `root`, whatever the path
    would otherwise say."""
    return (
        f"import sys; sys.path.insert(0, {root!r}); import runpy; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )


def python_argv(
    module: str,
    *args: str,
    python: str = sys.executable,
    root: str | None = PLATFORM_ROOT,
) -> list[str]:
    """`python -I ...` running `module` with `args`: from `root` first on the path (the
    platform's own source), or with `root=None` from the interpreter's own environment
    (where the platform is installed into it)."""
    if root is None:
        return [python, "-I", "-m", module, *args]
    return [python, "-I", "-c", bootstrap(module, root), *args]
