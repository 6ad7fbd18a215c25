"""DLaaS: the Python client and the `dlaas` command line.

    from dlaas import Client

Importing it needs none of the server's dependencies (the server is only loaded by
`dlaas up`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dlaas")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

from dlaas.client import Client, LogStream
from dlaas.errors import (
    ApiError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    DlaasError,
    FieldError,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
    ValidationError,
    WaitTimeout,
)
from dlaas.models import (
    ApiKey,
    Deployment,
    DeploymentVersion,
    MetricPoint,
    Page,
    ResultFile,
    Signature,
    Tenant,
    Tensor,
    Training,
    Usage,
    Use,
    VersionList,
)

__all__ = [
    "ApiError",
    "ApiKey",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Deployment",
    "DeploymentVersion",
    "DlaasError",
    "FieldError",
    "Forbidden",
    "LogStream",
    "MetricPoint",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "RateLimited",
    "ResultFile",
    "ServerError",
    "Signature",
    "Tenant",
    "Tensor",
    "Training",
    "Unauthorized",
    "Usage",
    "Use",
    "ValidationError",
    "VersionList",
    "WaitTimeout",
    "__version__",
]
