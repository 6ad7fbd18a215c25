"""Classify, Regress and MultiInference of TensorFlow Serving's gRPC API: the request's
tf.Examples (with their context) serialized as the signature's one input, scored through
the same ScoringService as Predict, the outputs read as TensorFlow Serving's classifier
and regressor read them (`tfs_infer`). Requests arrive parsed (`grpc_api`)."""

from __future__ import annotations

from typing import Any

from grpc import aio

from service.domain.signature import CLASSIFY_METHOD, REGRESS_METHOD, SignatureInfo
from service.scoring.arrays import InvalidPayload
from service.scoring.grpc_common import api_key, fill_spec, rate_metadata, requested_version
from service.scoring.ratelimit import RateDecision
from service.scoring.service import ScoringService
from service.scoring.tf_example import serialized_examples
from service.scoring.tfs_infer import (
    classifications,
    examples_request,
    inference_signature,
    regressions,
)
from service.scoring.tfs_protos import ServingMessages

_METHODS = (CLASSIFY_METHOD, REGRESS_METHOD)


def _examples(request_input: Any) -> list[bytes]:
    """The serialized examples of a request's Input."""
    kind = request_input.WhichOneof("kind")
    if kind == "example_list":
        return serialized_examples(list(request_input.example_list.examples))
    if kind == "example_list_with_context":
        listed = request_input.example_list_with_context
        return serialized_examples(list(listed.examples), listed.context)
    raise InvalidPayload("/input", "Input is empty")


class InferenceCalls:
    def __init__(self, scoring: ScoringService, messages: ServingMessages) -> None:
        self.scoring = scoring
        self.messages = messages

    async def _run(
        self,
        spec: Any,
        request_input: Any,
        method: str,
        context: aio.ServicerContext,
    ) -> tuple[int, SignatureInfo, dict[str, Any], int, RateDecision]:
        scoring = self.scoring
        with scoring.arriving(spec.name) as arrived:
            tenant, target = await scoring.caller(
                api_key(context), spec.name, *requested_version(spec), by_name=True
            )
            version = target.version
            signature = inference_signature(target.signatures, spec.signature_name, method)
            checked = examples_request(signature, _examples(request_input))
            outputs, decision = await scoring.score(tenant, checked, target, arrived)
        return version, signature, outputs, checked.rows, decision

    def _classification(self, into: Any, signature: SignatureInfo, outputs: Any, rows: int) -> None:
        for classes in classifications(signature, outputs, rows):
            entry = into.classifications.add()
            for found in classes:
                item = entry.classes.add()
                item.label = found.label.decode(errors="replace")
                if found.score is not None:
                    item.score = found.score

    def _regression(self, into: Any, signature: SignatureInfo, outputs: Any, rows: int) -> None:
        for value in regressions(signature, outputs, rows):
            into.regressions.add().value = value

    async def classify(self, request: Any, context: aio.ServicerContext) -> Any:
        spec = request.model_spec
        version, signature, outputs, rows, decision = await self._run(
            spec, request.input, CLASSIFY_METHOD, context
        )
        response = self.messages.ClassificationResponse()
        fill_spec(response.model_spec, spec.name, version, signature.name)
        self._classification(response.result, signature, outputs, rows)
        rate_metadata(context, decision)
        return response

    async def regress(self, request: Any, context: aio.ServicerContext) -> Any:
        spec = request.model_spec
        version, signature, outputs, rows, decision = await self._run(
            spec, request.input, REGRESS_METHOD, context
        )
        response = self.messages.RegressionResponse()
        fill_spec(response.model_spec, spec.name, version, signature.name)
        self._regression(response.result, signature, outputs, rows)
        rate_metadata(context, decision)
        return response

    async def multi_inference(self, request: Any, context: aio.ServicerContext) -> Any:
        """Each task (a classify or regress signature of one model) on the same examples,
        in the order asked; checked as TensorFlow Serving checks them first."""
        tasks = list(request.tasks)
        if not tasks:
            raise InvalidPayload("/tasks", "Must specify at least one task.")
        names = {task.model_spec.name for task in tasks}
        if len(names) != 1:
            raise InvalidPayload(
                "/tasks",
                "All ModelSpecs in a MultiInferenceRequest must access the same model name.",
            )
        seen: set[str] = set()
        for task in tasks:
            if task.method_name not in _METHODS:
                raise InvalidPayload(
                    "/tasks", f"Unsupported signature method_name: {task.method_name}"
                )
            signature = task.model_spec.signature_name or "serving_default"
            if signature in seen:
                raise InvalidPayload("/tasks", f"Duplicate evaluation of signature: {signature}")
            seen.add(signature)
        response = self.messages.MultiInferenceResponse()
        decision = None
        for task in tasks:
            version, signature_info, outputs, rows, decision = await self._run(
                task.model_spec, request.input, task.method_name, context
            )
            result = response.results.add()
            fill_spec(result.model_spec, task.model_spec.name, version, signature_info.name)
            if task.method_name == CLASSIFY_METHOD:
                self._classification(result.classification_result, signature_info, outputs, rows)
            else:
                self._regression(result.regression_result, signature_info, outputs, rows)
        if decision is not None:
            rate_metadata(context, decision)
        return response
