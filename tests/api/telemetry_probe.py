"""Run as a script (`python telemetry_probe.py api|scoring`, DLAAS_HOME set): installs
OpenTelemetry tracer and meter providers that count what is asked of them, as an agent or
FASTAPI_OTEL_AUTO_CONFIGURE would, serves a few requests through the app, and prints the
JSON list of what the app asked for."""

from __future__ import annotations

import json
import sys
from typing import Any

from opentelemetry import metrics, trace

asked: list[str] = []


class CountingTracer(trace.NoOpTracer):
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        asked.append("span")
        return super().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        asked.append("span")
        return super().start_as_current_span(*args, **kwargs)


class CountingTracerProvider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        asked.append("tracer")
        return CountingTracer()


class CountingMeterProvider(metrics.MeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> metrics.Meter:
        asked.append("meter")
        return metrics.NoOpMeterProvider().get_meter(*args, **kwargs)


trace.set_tracer_provider(CountingTracerProvider())
metrics.set_meter_provider(CountingMeterProvider())

from fastapi.testclient import TestClient  # noqa: E402

if sys.argv[1] == "api":
    from service.api.app import create_app

    app = create_app()
else:
    from service.scoring.app import create_scoring_app

    app = create_scoring_app()

with TestClient(app) as client:
    for path in ("/healthz", "/v1/trainings", "/v1/deployments/x/predictions"):
        client.get(path, headers={"Authorization": "Bearer not-a-key"})
print(json.dumps(asked))
