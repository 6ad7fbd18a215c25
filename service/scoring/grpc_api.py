"""TensorFlow Serving's gRPC API: `tensorflow.serving.PredictionService` (Predict and
GetModelMetadata) on DLAAS_SCORING_GRPC_PORT, beside the REST predictions.

An unmodified TensorFlow Serving client (`PredictionServiceStub` and a `PredictRequest`)
calls it: the model name is the deployment id, the signature is picked by name (default
serving_default), the version by `model_spec.version` or `model_spec.version_label` (the
default version without either; an unknown one is NOT_FOUND), and the tenant's API key
travels as `authorization: Bearer <key>` metadata. It runs on the scoring app's event
loop and scores through the same ScoringService as the REST route (the caller and
deployment lookup, the rate limit, the batchers and model processes), so the numbers
and the refusals are the same; a refusal is the gRPC status of its HTTP one
(`status_code`) with the problem's detail, and a 429's Retry-After is trailing metadata
(`retry-after`), as are `x-ratelimit-limit` and `x-ratelimit-remaining` on every
answer. The requests are decoded without TensorFlow
(`tfs_protos`, `tensors`): a request is one or two copies of its bytes, where REST parses
JSON numbers one by one, which costs more than the call of a small model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from service.db.session import DATABASE_UNAVAILABLE
from service.domain.signature import SignatureInfo, TensorInfo
from service.errors import DlaasError
from service.http.auth import key_of_header
from service.http.limits import CallerCheck
from service.http.problems import database_unavailable
from service.scoring.arrays import InvalidPayload
from service.scoring.grpc_gate import CallerGate
from service.scoring.inputs import signature_of, tensors_request
from service.scoring.service import ScoringService
from service.scoring.tensors import TensorCodec
from service.scoring.tfs_protos import ServingMessages, serving_messages
from service.settings import Settings

log = logging.getLogger("dlaas.scoring")

SERVICE = "tensorflow.serving.PredictionService"
SIGNATURE_DEF = "signature_def"
# The method of every signature tf.saved_model.save exports (TensorFlow Serving's Predict).
PREDICT_METHOD = "tensorflow/serving/predict"
_SIGNATURE_DEF_MAP_URL = "type.googleapis.com/tensorflow.serving.SignatureDefMap"

# An HTTP problem's status as the gRPC status that means the same to a client.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
}


def status_code(error: DlaasError) -> grpc.StatusCode:
    if error.status in _CODES:
        return _CODES[error.status]
    return grpc.StatusCode.INTERNAL if error.status >= 500 else grpc.StatusCode.INVALID_ARGUMENT


def _api_key(context: aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return key_of_header(value if isinstance(value, str) else value.decode())
    return key_of_header("")


class PredictionService:
    """The handlers of `tensorflow.serving.PredictionService` over one ScoringService."""

    def __init__(self, scoring: ScoringService, *, max_bytes: int) -> None:
        self.scoring = scoring
        self.messages: ServingMessages = serving_messages()
        self.codec = TensorCodec(self.messages.data_types, max_bytes=max_bytes)

    def handler(self) -> grpc.GenericRpcHandler:
        # Requests arrive as bytes and are parsed here, so a malformed one is
        # INVALID_ARGUMENT rather than the INTERNAL of a failing deserializer.
        m = self.messages
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Predict": grpc.unary_unary_rpc_method_handler(
                    self.predict, response_serializer=m.PredictResponse.SerializeToString
                ),
                "GetModelMetadata": grpc.unary_unary_rpc_method_handler(
                    self.get_model_metadata,
                    response_serializer=m.GetModelMetadataResponse.SerializeToString,
                ),
            },
        )

    async def predict(self, body: bytes, context: aio.ServicerContext) -> Any:
        try:
            return await self._predict(_parse(self.messages.PredictRequest, body), context)
        except BaseException as e:
            await _refuse(context, e)
            raise

    async def get_model_metadata(self, body: bytes, context: aio.ServicerContext) -> Any:
        try:
            request = _parse(self.messages.GetModelMetadataRequest, body)
            return await self._metadata(request, context)
        except BaseException as e:
            await _refuse(context, e)
            raise

    async def _predict(self, request: Any, context: aio.ServicerContext) -> Any:
        scoring = self.scoring
        spec = request.model_spec
        with scoring.arriving(spec.name) as arrived:
            tenant, target = await scoring.caller(_api_key(context), spec.name, *_version(spec))
            signature = signature_of(spec.signature_name, target.signatures)
            wanted = self._outputs(signature, request.output_filter)
            tensors = {}
            for name, tensor in request.inputs.items():
                info = signature.inputs.get(name)
                if info is None:
                    raise InvalidPayload(
                        f"/inputs/{name}",
                        f"is not an input of signature '{signature.name}' "
                        f"({', '.join(signature.inputs)})",
                    )
                tensors[name] = self.codec.to_array(tensor, info, f"/inputs/{name}")
            checked = tensors_request(signature, tensors)
            outputs, decision = await scoring.score(tenant, checked, target, arrived)
        response = self.messages.PredictResponse()
        response.model_spec.name = target.id
        response.model_spec.version.value = target.version
        response.model_spec.signature_name = signature.name
        for name in wanted or [n for n in signature.outputs if n in outputs] or sorted(outputs):
            self.codec.to_proto(outputs[name], response.outputs[name])
        context.set_trailing_metadata(
            (
                ("x-ratelimit-limit", str(decision.limit)),
                ("x-ratelimit-remaining", str(decision.remaining)),
            )
        )
        return response

    @staticmethod
    def _outputs(signature: SignatureInfo, output_filter: Sequence[str]) -> list[str]:
        """The outputs a request's output_filter asks for (all when empty)."""
        for name in output_filter:
            if name not in signature.outputs:
                raise InvalidPayload(
                    "/output_filter",
                    f"'{name}' is not an output of signature '{signature.name}' "
                    f"({', '.join(signature.outputs)})",
                )
        return list(dict.fromkeys(output_filter))

    async def _metadata(self, request: Any, context: aio.ServicerContext) -> Any:
        # The caller first, as for Predict: a bad key is UNAUTHENTICATED whatever it asks.
        spec = request.model_spec
        _, target = await self.scoring.caller(_api_key(context), spec.name, *_version(spec))
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidPayload("/metadata_field", f"is empty; ask for '{SIGNATURE_DEF}'")
        for field in fields:
            if field != SIGNATURE_DEF:
                raise InvalidPayload(
                    "/metadata_field", f"'{field}' is not supported; ask for '{SIGNATURE_DEF}'"
                )
        m = self.messages
        defs = m.SignatureDefMap()
        for name, signature in sorted(target.signatures.items()):
            signature_def = defs.signature_def[name]
            signature_def.method_name = PREDICT_METHOD
            for key, info in signature.inputs.items():
                self._tensor_info(info, signature_def.inputs[key])
            for key, info in signature.outputs.items():
                self._tensor_info(info, signature_def.outputs[key])
        response = m.GetModelMetadataResponse()
        response.model_spec.name = target.id
        response.model_spec.version.value = target.version
        packed = response.metadata[SIGNATURE_DEF]
        packed.type_url = _SIGNATURE_DEF_MAP_URL
        packed.value = defs.SerializeToString()
        return response

    def _tensor_info(self, info: TensorInfo, into: Any) -> None:
        """A signature's input or output as TensorFlow's TensorInfo: dtype and shape (-1
        for a dimension of any size). The graph's tensor names are not kept, and clients
        address inputs by their keys."""
        into.dtype = self.codec.data_type(info.dtype)
        if info.shape is None:
            into.tensor_shape.unknown_rank = True
            return
        for size in info.shape:
            into.tensor_shape.dim.add().size = -1 if size is None else size


def _version(spec: Any) -> tuple[int | None, str | None]:
    """The version a ModelSpec asks for: `version` or `version_label` (a oneof), or
    neither (the default version)."""
    chosen = spec.WhichOneof("version_choice")
    if chosen == "version":
        return int(spec.version.value), None
    if chosen == "version_label":
        return None, str(spec.version_label)
    return None, None


def _parse(message: Any, body: bytes) -> Any:
    try:
        return message.FromString(body)
    except DecodeError as e:
        raise InvalidPayload("body", f"is not a {message.DESCRIPTOR.name} ({e})") from e


async def _refuse(context: aio.ServicerContext, error: BaseException) -> None:
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


async def start_server(
    scoring: ScoringService, settings: Settings, callers: CallerCheck
) -> tuple[aio.Server, int]:
    """The gRPC server on DLAAS_SCORING_GRPC_HOST:DLAAS_SCORING_GRPC_PORT, started on this
    event loop; the port it listens on (the one the system chose for port 0). Each call's
    key and request rate are checked before its message is read (`grpc_gate`), and a
    message larger than DLAAS_MAX_PREDICTION_BYTES is refused (RESOURCE_EXHAUSTED) by the
    server before it is parsed."""
    assert settings.scoring_grpc_port is not None
    service = PredictionService(scoring, max_bytes=settings.max_prediction_bytes)
    server = aio.server(
        interceptors=[CallerGate(callers, _refuse)],
        options=[
            ("grpc.max_receive_message_length", settings.max_prediction_bytes),
            ("grpc.max_send_message_length", -1),
            # A port another process holds is an error here, not a shared listener.
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((service.handler(),))
    address = f"{settings.scoring_grpc_host}:{settings.scoring_grpc_port}"
    try:
        port: int = server.add_insecure_port(address)
    except RuntimeError as e:
        raise RuntimeError(
            f"the scoring gRPC API cannot listen on {address} (DLAAS_SCORING_GRPC_HOST, "
            f"DLAAS_SCORING_GRPC_PORT): {e}"
        ) from e
    await server.start()
    log.info("scoring: gRPC PredictionService on %s:%s", settings.scoring_grpc_host, port)
    return server, port
