"""Which server carries the scoring gRPC API (DLAAS_SCORING_GRPC_FRONT): the native front
(`grpc_front`, where `dlaas-grpc-front` is installed) or grpcio's asyncio server in this
process (`grpc_api.start_grpcio_server`). Both serve the same methods
(`grpc_api.PredictionService`) after the same check of the caller, on this event loop."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from service.http.limits import CallerCheck
from service.scoring.grpc_api import PredictionService, start_grpcio_server
from service.scoring.grpc_front import BINARY, front_binary, start_front
from service.scoring.service import ScoringService
from service.settings import Settings


class GrpcServer(Protocol):
    async def stop(self, grace: float | None) -> None: ...


def front_to_use(setting: str, installed: Path | None) -> Path | None:
    """The front program to start for DLAAS_SCORING_GRPC_FRONT=`setting` where `installed`
    is the built one (None: not built); None: grpcio's server."""
    if setting == "python":
        return None
    if installed is None and setting == "native":
        raise RuntimeError(
            f"DLAAS_SCORING_GRPC_FRONT=native, but {BINARY} is not installed beside this "
            "Python (`make install` builds it; DLAAS_SCORING_GRPC_FRONT=python serves the "
            "port with grpcio instead)"
        )
    return installed


async def start_server(
    scoring: ScoringService, settings: Settings, callers: CallerCheck
) -> tuple[GrpcServer, int]:
    """The scoring gRPC API on DLAAS_SCORING_GRPC_HOST:DLAAS_SCORING_GRPC_PORT, and the
    port it listens on (the one the system chose for port 0)."""
    binary = front_to_use(settings.scoring_grpc_front, front_binary())
    service = PredictionService(scoring, max_bytes=settings.max_prediction_bytes)
    if binary is not None:
        return await start_front(binary, service, settings, callers)
    return await start_grpcio_server(service, settings, callers)
