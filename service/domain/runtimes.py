"""Which trainings can run here: the rule of installed runtimes.

Each (framework, version) runs in the runtime the catalog names (Catalog.runtime). A
training whose runtime is not installed on this installation is refused at submission,
naming the command that installs it. Pure: the caller says which runtimes are installed.
"""

from __future__ import annotations

from collections.abc import Container

from service.domain.catalog import Catalog
from service.errors import FieldError


def install_command(runtime: str) -> str:
    return f"dlaas runtimes install {runtime}"


def runtime_refusal(
    catalog: Catalog, framework: str, version: str, installed: Container[str]
) -> FieldError | None:
    """Why a training of (framework, version) cannot run with `installed` runtimes (any
    container: a submission asks about its one runtime alone); None when its runtime is
    installed."""
    runtime = catalog.runtime(framework, version)
    if runtime in installed:
        return None
    return FieldError(
        "/framework/version",
        f"{framework} {version} runs in the runtime '{runtime}', which is not installed on "
        f"this platform; its operator installs it with `{install_command(runtime)}`",
    )
