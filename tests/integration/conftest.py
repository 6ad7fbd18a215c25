"""Fixtures of the integration tests that need a framework runtime built."""

from __future__ import annotations

import pytest

from service import runtimes
from tests.integration.platform_harness import ensure_runtime


@pytest.fixture(scope="session")
def horovod_runtime() -> runtimes.RuntimeInfo:
    """The Horovod runtime, which tensorflow-horovod trainings run in:
    built into the tests' shared runtimes directory on first use."""
    return ensure_runtime("horovod-tf2.14")


@pytest.fixture(scope="session")
def ddl_runtime() -> runtimes.RuntimeInfo:
    """The DDL runtime (the Horovod runtime's pins plus the open `ddl` package), which
    tensorflow-ddl trainings run in: built into the same directory on first use."""
    return ensure_runtime("ddl-tf2.14")


@pytest.fixture(scope="session")
def pytorch_runtime() -> runtimes.RuntimeInfo:
    """The PyTorch runtime (torch 2.13.0 CPU, Open MPI, the open DDL's PyTorch API), which
    pytorch and pytorch-ddl trainings run in: built into the same directory on first use."""
    return ensure_runtime("pytorch2.13")


@pytest.fixture
def mpi_runtime(request: pytest.FixtureRequest, framework: str) -> runtimes.RuntimeInfo:
    """The runtime of the test's `framework` parameter (tensorflow-horovod or -ddl)."""
    name = "ddl_runtime" if framework == "tensorflow-ddl" else "horovod_runtime"
    info: runtimes.RuntimeInfo = request.getfixturevalue(name)
    return info
