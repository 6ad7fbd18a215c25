"""Predict, GetModelMetadata (PredictionService) and GetModelStatus (ModelService) of
TensorFlow Serving's gRPC API, over one ScoringService. Requests arrive parsed
(`grpc_api` parses them and renders refusals)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpc import aio

from service.domain.signature import SignatureInfo
from service.scoring.arrays import InvalidPayload
from service.scoring.grpc_common import api_key, fill_spec, rate_metadata, requested_version
from service.scoring.inputs import signature_of, tensors_request
from service.scoring.service import ScoringService
from service.scoring.tensors import TensorCodec
from service.scoring.tfs_metadata import (
    SIGNATURE_DEF,
    metadata_response,
    status_response,
    version_statuses,
)
from service.scoring.tfs_protos import ServingMessages
from service.scoring.versions import resolve_version


class ModelCalls:
    """The handlers that name a model and a signature and score or describe it."""

    def __init__(self, scoring: ScoringService, messages: ServingMessages, codec: TensorCodec):
        self.scoring = scoring
        self.messages = messages
        self.codec = codec

    async def predict(self, request: Any, context: aio.ServicerContext) -> Any:
        scoring = self.scoring
        spec = request.model_spec
        with scoring.arriving(spec.name) as arrived:
            tenant, target = await scoring.caller(
                api_key(context), spec.name, *requested_version(spec), by_name=True
            )
            version = target.version
            signature = signature_of(spec.signature_name, target.signatures)
            wanted = _outputs(signature, request.output_filter)
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
        fill_spec(response.model_spec, spec.name, version, signature.name)
        for name in wanted or [n for n in signature.outputs if n in outputs] or sorted(outputs):
            self.codec.to_proto(outputs[name], response.outputs[name])
        rate_metadata(context, decision)
        return response

    async def metadata(self, request: Any, context: aio.ServicerContext) -> Any:
        # The caller first, as for Predict: a bad key is UNAUTHENTICATED whatever it asks.
        spec = request.model_spec
        _, target = await self.scoring.caller(
            api_key(context), spec.name, *requested_version(spec), by_name=True
        )
        version = target.version
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidPayload("/metadata_field", f"is empty; ask for '{SIGNATURE_DEF}'")
        for field in fields:
            if field != SIGNATURE_DEF:
                raise InvalidPayload(
                    "/metadata_field", f"'{field}' is not supported; ask for '{SIGNATURE_DEF}'"
                )
        return metadata_response(self.messages, self.codec, spec.name, version, target.signatures)

    async def status(self, request: Any, context: aio.ServicerContext) -> Any:
        """The model's status in any state: LOADING while it deploys, AVAILABLE, or END
        with the reason when it failed."""
        spec = request.model_spec
        target, state, message = await self.scoring.state_of(api_key(context), spec.name)
        asked = requested_version(spec)
        version = None if asked == (None, None) else resolve_version(target, *asked)
        statuses = version_statuses(target, state, message, version)
        return status_response(self.messages, statuses)


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
