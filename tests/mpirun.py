"""A script under a runtime's own `mpirun`, as the tests and benchmarks start it by hand:
oversubscribed on this machine, from /, with the runtime's bin/ first on PATH and none of
the caller's Python, Open MPI or Horovod variables."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from service.runtimes import RuntimeInfo


def mpirun(
    runtime: RuntimeInfo,
    ranks: int,
    script: Path,
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`script` with `args` under `mpirun -np ranks`; `env` is added to the environment."""
    bindir = Path(runtime.python).parent
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OMPI_", "HOROVOD_"))
    }
    inherited["PATH"] = f"{bindir}{os.pathsep}{inherited.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(
        [
            str(bindir / "mpirun"),
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            str(ranks),
            runtime.python,
            str(script),
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**inherited, **(env or {})},
        cwd="/",
    )
