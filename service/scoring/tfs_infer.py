"""TensorFlow Serving's Classify and Regress on a deployed model: which signatures they
may call, the batch of serialized tf.Examples as that signature's input, and its outputs
as classifications or regressions. Pure: numpy, no TensorFlow, no gRPC; the gRPC API and
the REST paths both use it (each writes the results in its own form).

As TensorFlow Serving's classifier and regressor: the signature's method_name must be
tensorflow/serving/classify (or .../regress), it takes one DT_STRING input (the
examples); a classification has a `classes` (strings) and/or a `scores` (floats) output,
each [batch, classes]; a regression one `outputs` of [batch] or [batch, 1] floats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from service.domain.signature import CLASSIFY_METHOD, REGRESS_METHOD, SignatureInfo
from service.scoring.arrays import InvalidPayload
from service.scoring.inputs import ScoringRequest, signature_of, tensors_request

CLASSES = "classes"
SCORES = "scores"
OUTPUTS = "outputs"
_KIND = {CLASSIFY_METHOD: "classification", REGRESS_METHOD: "regression"}


@dataclass(frozen=True)
class Class:
    label: bytes
    score: float | None


def inference_signature(
    signatures: Mapping[str, SignatureInfo], name: str, method: str
) -> SignatureInfo:
    """The signature `name` (serving_default when empty) if Classify (`method`
    CLASSIFY_METHOD) or Regress may call it; UnknownSignature or InvalidPayload."""
    signature = signature_of(name, signatures)
    if signature.method != method:
        raise InvalidPayload(
            "/signature_name",
            f"Expected {_KIND[method]} signature method_name to be {method}. "
            f"Was: {signature.method}",
        )
    inputs = list(signature.inputs.values())
    if len(inputs) != 1 or inputs[0].dtype != "string":
        raise InvalidPayload(
            "/signature_name",
            f"signature '{signature.name}' must have exactly one input, of DT_STRING "
            "(serialized tf.Examples)",
        )
    return signature


def examples_request(signature: SignatureInfo, examples: Sequence[bytes]) -> ScoringRequest:
    """The serialized examples as the signature's one input."""
    if not examples:
        raise InvalidPayload("/input", "Input is empty")
    (info,) = signature.inputs.values()
    batch: np.ndarray = np.empty(len(examples), dtype=object)
    batch[:] = list(examples)
    if info.shape is not None and len(info.shape) == 2:  # [batch, 1]
        batch = batch.reshape(-1, 1)
    return tensors_request(signature, {info.name: batch})


def _output(outputs: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    value = outputs.get(name)
    return None if value is None else np.asarray(value)


def classifications(
    signature: SignatureInfo, outputs: Mapping[str, np.ndarray], rows: int
) -> list[list[Class]]:
    """Per example, its classes (label and score) in the model's order."""
    classes, scores = _output(outputs, CLASSES), _output(outputs, SCORES)
    if classes is None and scores is None:
        raise InvalidPayload(
            "/signature_name",
            f"signature '{signature.name}' has neither a '{CLASSES}' nor a '{SCORES}' output",
        )
    for name, array in ((CLASSES, classes), (SCORES, scores)):
        if array is not None and (array.ndim != 2 or array.shape[0] != rows):
            raise InvalidPayload(
                f"/outputs/{name}",
                f"Expected Tensor shape: [batch_size num_classes] but got {list(array.shape)}",
            )
    if classes is not None and scores is not None and classes.shape != scores.shape:
        raise InvalidPayload(
            "/outputs",
            f"Tensors class and score should match in shape. Class shape: "
            f"{list(classes.shape)}, score shape: {list(scores.shape)}",
        )
    if scores is not None and scores.dtype.kind != "f":
        raise InvalidPayload(
            "/outputs/scores", f"Expected scores Tensor of DT_FLOAT. Got: {scores.dtype}"
        )
    count = (classes if classes is not None else scores).shape[1]  # type: ignore[union-attr]
    results: list[list[Class]] = []
    for i in range(rows):
        results.append(
            [
                Class(
                    label=_label(classes[i, j]) if classes is not None else b"",
                    score=float(scores[i, j]) if scores is not None else None,
                )
                for j in range(count)
            ]
        )
    return results


def _label(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def regressions(
    signature: SignatureInfo, outputs: Mapping[str, np.ndarray], rows: int
) -> list[float]:
    """Per example, its regression value."""
    values = _output(outputs, OUTPUTS)
    if values is None:
        raise InvalidPayload(
            "/signature_name", f"signature '{signature.name}' has no '{OUTPUTS}' output"
        )
    if values.dtype.kind != "f":
        raise InvalidPayload(
            "/outputs/outputs", f"Expected output Tensor of DT_FLOAT. Got: {values.dtype}"
        )
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)) or (
        values.shape[0] != rows
    ):
        raise InvalidPayload(
            "/outputs/outputs",
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but "
            f"got {list(values.shape)}",
        )
    return [float(v) for v in values.reshape(-1)]
