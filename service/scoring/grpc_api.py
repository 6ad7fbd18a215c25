"""TensorFlow Serving's whole gRPC API on DLAAS_SCORING_GRPC_PORT, beside the REST
predictions: `tensorflow.serving.PredictionService` (Predict, GetModelMetadata in
`grpc_predict`; Classify, Regress, MultiInference in `grpc_inference`) and
`tensorflow.serving.ModelService` (GetModelStatus).

An unmodified TensorFlow Serving client (`PredictionServiceStub`, `ModelServiceStub` and
their requests) calls it: the model name is the deployment's id or name, the version
(`model_spec.version` or `.version_label`) is resolved by `versions.resolve_version`
(NOT_FOUND for one the deployment lacks), the signature is picked by name (default
serving_default; FAILED_PRECONDITION for one the model lacks) and the tenant's API key
travels as `authorization: Bearer <key>` metadata. Answers carry the model spec (name,
version, signature name). It runs on the scoring app's event loop and scores through the same
ScoringService as the REST route (the caller and deployment lookup, the rate limit, the
batchers and model processes), so the numbers and the refusals are the same; a refusal is
the gRPC status of its HTTP one (`status_code`) with the problem's detail, and a 429's
Retry-After is trailing metadata (`retry-after`), as are `x-ratelimit-limit` and
`x-ratelimit-remaining` on every answer. The requests are decoded without TensorFlow
(`tfs_protos`, `tensors`): a request is one or two copies of its bytes, where REST parses
JSON numbers one by one, which costs more than the call of a small model.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from service.db.session import DATABASE_UNAVAILABLE
from service.errors import DlaasError
from service.http.limits import CallerCheck
from service.http.problems import database_unavailable
from service.scoring.arrays import InvalidPayload
from service.scoring.grpc_common import status_code
from service.scoring.grpc_gate import CallerGate
from service.scoring.grpc_inference import InferenceCalls
from service.scoring.grpc_predict import ModelCalls
from service.scoring.service import ScoringService
from service.scoring.tensors import TensorCodec
from service.scoring.tfs_protos import ServingMessages, serving_messages
from service.settings import Settings

log = logging.getLogger("dlaas.scoring")

SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
# Each method: the request message's name in ServingMessages, the handler's name here.
_PREDICTION_METHODS = {
    "Predict": "PredictRequest",
    "GetModelMetadata": "GetModelMetadataRequest",
    "Classify": "ClassificationRequest",
    "Regress": "RegressionRequest",
    "MultiInference": "MultiInferenceRequest",
}
_MODEL_METHODS = {"GetModelStatus": "GetModelStatusRequest"}
_RESPONSES = {
    "Predict": "PredictResponse",
    "GetModelMetadata": "GetModelMetadataResponse",
    "Classify": "ClassificationResponse",
    "Regress": "RegressionResponse",
    "MultiInference": "MultiInferenceResponse",
    "GetModelStatus": "GetModelStatusResponse",
}

Handler = Callable[[Any, aio.ServicerContext], Awaitable[Any]]


class Method(NamedTuple):
    """One unary method: the handler of its request's bytes, and its answer's serializer."""

    handle: Callable[[bytes, aio.ServicerContext], Awaitable[Any]]
    serialize: Callable[[Any], bytes]


class PredictionService:
    """The handlers of `tensorflow.serving.PredictionService` and `.ModelService` over one
    ScoringService: each parses its request (so a malformed one is INVALID_ARGUMENT
    rather than the INTERNAL of a failing deserializer), calls its method
    (`grpc_predict`, `grpc_inference`) and ends a refused call with its status."""

    def __init__(self, scoring: ScoringService, *, max_bytes: int) -> None:
        self.scoring = scoring
        self.messages: ServingMessages = serving_messages()
        self.codec = TensorCodec(self.messages.data_types, max_bytes=max_bytes)
        models = ModelCalls(scoring, self.messages, self.codec)
        inference = InferenceCalls(scoring, self.messages)
        self._calls: dict[str, Handler] = {
            "Predict": models.predict,
            "GetModelMetadata": models.metadata,
            "GetModelStatus": models.status,
            "Classify": inference.classify,
            "Regress": inference.regress,
            "MultiInference": inference.multi_inference,
        }

    def unary_methods(self) -> dict[str, Method]:
        """Every method by its path (`/tensorflow.serving.PredictionService/Predict`): its
        handler of the request's bytes, which parses them, calls the method and ends a
        refused call with its status, and its answer's serializer."""
        return {
            f"/{service}/{name}": method
            for service, methods in self._by_service().items()
            for name, method in methods.items()
        }

    def _by_service(self) -> dict[str, dict[str, Method]]:
        return {
            service: {name: self._method(name, request) for name, request in methods.items()}
            for service, methods in (
                (SERVICE, _PREDICTION_METHODS),
                (MODEL_SERVICE, _MODEL_METHODS),
            )
        }

    def _method(self, name: str, request_message: str) -> Method:
        message = getattr(self.messages, request_message)
        call = self._calls[name]

        async def handle(body: bytes, context: aio.ServicerContext) -> Any:
            try:
                return await call(_parse(message, body), context)
            except BaseException as e:
                await refuse(context, e)
                raise

        return Method(handle, getattr(self.messages, _RESPONSES[name]).SerializeToString)

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The methods as grpc.aio's handlers, one generic handler per service."""
        return [
            grpc.method_handlers_generic_handler(
                service,
                {
                    name: grpc.unary_unary_rpc_method_handler(
                        method.handle, response_serializer=method.serialize
                    )
                    for name, method in methods.items()
                },
            )
            for service, methods in self._by_service().items()
        ]


def _parse(message: Any, body: bytes) -> Any:
    try:
        return message.FromString(body)
    except DecodeError as e:
        raise InvalidPayload("body", f"is not a {message.DESCRIPTOR.name} ({e})") from e


async def refuse(context: aio.ServicerContext, error: BaseException) -> None:
    """End the call with the gRPC status of `error` (returns only for errors that are not
    a refusal: cancellation, the abort itself)."""
    if isinstance(error, DATABASE_UNAVAILABLE):
        error = database_unavailable(error)
    if isinstance(error, DlaasError):
        trailing = tuple((k.lower(), v) for k, v in error.headers.items())
        await context.abort(status_code(error), error.detail, trailing_metadata=trailing)
    if isinstance(error, Exception) and not isinstance(error, aio.AbortError):
        log.exception("scoring: a gRPC call failed", exc_info=error)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the scoring log")


async def start_grpcio_server(
    service: PredictionService, settings: Settings, callers: CallerCheck
) -> tuple[aio.Server, int]:
    """The gRPC server on DLAAS_SCORING_GRPC_HOST:DLAAS_SCORING_GRPC_PORT, started on this
    event loop; the port it listens on (the one the system chose for port 0). Each call's
    key and request rate are checked before its message is read (`grpc_gate`), and a
    message larger than DLAAS_MAX_PREDICTION_BYTES is refused (RESOURCE_EXHAUSTED) by the
    server before it is parsed."""
    assert settings.scoring_grpc_port is not None
    server = aio.server(
        interceptors=[CallerGate(callers, refuse)],
        options=[
            ("grpc.max_receive_message_length", settings.max_prediction_bytes),
            ("grpc.max_send_message_length", -1),
            # A port another process holds is an error here, not a shared listener.
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers(service.handlers())
    address = f"{settings.scoring_grpc_host}:{settings.scoring_grpc_port}"
    try:
        port: int = server.add_insecure_port(address)
    except RuntimeError as e:
        raise RuntimeError(
            f"the scoring gRPC API cannot listen on {address} (DLAAS_SCORING_GRPC_HOST, "
            f"DLAAS_SCORING_GRPC_PORT): {e}"
        ) from e
    await server.start()
    log.info(
        "scoring: gRPC PredictionService and ModelService on %s:%s",
        settings.scoring_grpc_host,
        port,
    )
    return server, port
