"""`dlaas runtimes list|install`: the framework runtimes of this machine's platform.

They act on the runtimes directory of this machine's settings (DLAAS_RUNTIMES_DIR, default
$DLAAS_HOME/runtimes), as `dlaas up` does on DLAAS_HOME, and on the catalog it serves
(DLAAS_CATALOG_FILE): which (framework, version) runs in which runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from service import runtimes
from service.platform import load_catalog
from service.runtimes import RuntimeBuildError
from service.settings import Settings

__all__ = ["RuntimeBuildError", "install", "listing"]


def definitions_dir(settings: Settings) -> Path:
    return settings.runtime_definitions_dir or runtimes.DEFINITIONS


def listing(settings: Settings | None = None) -> list[dict[str, Any]]:
    """Every runtime: its name, the (framework, version) pairs it serves, whether it is
    installed and, if so, where and what it provides."""
    settings = settings or Settings()
    directory = definitions_dir(settings)
    served = load_catalog(settings.catalog_file).runtimes_used()
    names = list(dict.fromkeys([*runtimes.known(directory), *served]))
    out = []
    for name in names:
        info = runtimes.installed(settings.runtimes_path, name, directory)
        out.append(
            {
                "name": name,
                "serves": [{"framework": f, "version": v} for f, v in served.get(name, [])],
                "installed": info is not None,
                "defined": name == runtimes.PLATFORM or name in runtimes.definitions(directory),
                "prefix": info.prefix if info else None,
                "provides": info.provides if info else {},
            }
        )
    return out


def install(
    names: list[str], progress: Callable[[str], None], settings: Settings | None = None
) -> list[dict[str, Any]]:
    """Install `names` (every defined runtime when empty); RuntimeBuildError if one cannot
    be built."""
    settings = settings or Settings()
    directory = definitions_dir(settings)
    chosen = names or [n for n in runtimes.known(directory) if n != runtimes.PLATFORM]
    done = []
    for name in chosen:
        info = runtimes.install(name, settings.runtimes_path, progress, directory)
        done.append(info.to_dict())
    return done
