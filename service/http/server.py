"""How the platform's HTTP apps are served: the uvicorn settings every entry point shares
(`dlaas up`, `python -m service.scoring`, and the image's `uvicorn` command through
`UVICORN_FLAGS`), and the FastAPI settings every app is made with.

- No proxy headers. uvicorn by default takes the client's address (and scheme) from
  X-Forwarded-For (X-Forwarded-Proto) when the connection comes from a trusted address,
  127.0.0.1 unless FORWARDED_ALLOW_IPS says otherwise. The request gate counts bad keys
  against the connection's peer (`service.http.limits.client_address`): a client on that
  address could name a new address with every request and never run out of its budget.
  Behind a proxy, clients share the proxy's budget (SECURITY.md, Not defended).
- No telemetry of the framework's own. FastAPI exports spans, metrics and logs of every
  request (its path, status, timing) wherever the process's OpenTelemetry providers are
  configured, by anything in the environment (`FASTAPI_OTEL_AUTO_CONFIGURE`, an agent):
  tenants' requests leave the platform only where the platform sends them. It also looked
  up the providers on every request to find them unconfigured.
- One write per small response (`HTTP_PROTOCOL`, service.http.protocol): uvicorn's own
  protocol wrote a response's head and its body with two system calls.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi.telemetry import TelemetryConfig

# uvicorn's httptools protocol with a response's head and body in one write
# (service.http.protocol).
HTTP_PROTOCOL = "service.http.protocol:HttpProtocol"

# What `python -m uvicorn ...` needs to serve the API as server_config does (the image,
# compose, the chart and the tests' separate API processes pass it).
UVICORN_FLAGS = ("--no-proxy-headers", "--http", HTTP_PROTOCOL)

# FastAPI(telemetry=...): none of its spans, metrics, operation spans or logs.
NO_FRAMEWORK_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "operation_spans": False,
    "logs": False,
    "auto_configure": False,
}


def server_config(app: Any, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for one of the platform's apps; `options` are uvicorn's
    (host, port, log_level, ...)."""
    return uvicorn.Config(app, proxy_headers=False, access_log=False, http=HTTP_PROTOCOL, **options)
