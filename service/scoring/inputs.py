"""Prediction payloads in, predictions out. Pure: JSON and numpy, no TensorFlow.

Three request forms are understood, the first two as TensorFlow Serving's REST API
defines them, the third as Watson Machine Learning sent them:

- row format ``{"instances": [...]}``: one entry per instance; the value of the only input,
  or an object naming every input. Answered ``{"predictions": [...]}`` (one entry per
  instance; an object of outputs when there are several).
- columnar ``{"inputs": ...}``: the whole batch per input (the value itself when the
  signature has one input). Answered ``{"outputs": ...}`` (an object when several).
- WML ``{"values": [[...], ...]}`` (with ``"fields"`` naming the inputs of each row when
  there are several). Answered ``{"fields": [<outputs>], "values": [[...], ...]}``.

Every request may name a ``signature_name`` (default ``serving_default``). Anything that
does not fit the signature is an `InvalidPayload` (400) naming the field, the input and the
dtype and shape it expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import orjson

from service.domain.deployments import SERVING_SIGNATURE
from service.domain.signature import SignatureInfo
from service.scoring.arrays import (
    InvalidPayload,
    UnknownSignature,
    check_shape,
    encode_answer,
    json_ready,
    to_array,
)

__all__ = [
    "InvalidPayload",
    "PayloadForm",
    "ScoringRequest",
    "decode_body",
    "encode_answer",
    "parse_request",
    "render",
    "signature_of",
    "tensors_request",
]

_FORMS = ("instances", "inputs", "values")
_KNOWN_KEYS = frozenset({*_FORMS, "signature_name", "fields"})
_EXAMPLE = '{"instances": [...]}'


class PayloadForm(StrEnum):
    INSTANCES = "instances"
    INPUTS = "inputs"
    VALUES = "values"


@dataclass(frozen=True)
class ScoringRequest:
    """A checked request: one array per input of the signature, in its dtype."""

    form: PayloadForm
    signature: SignatureInfo
    tensors: dict[str, np.ndarray]
    # Instances in the request (the shared first dimension); 1 for an unbatched signature.
    rows: int


def decode_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body."""
    if not body.strip():
        raise InvalidPayload("body", f"is empty; send a JSON object such as {_EXAMPLE}")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidPayload("body", f"is not valid JSON ({e})") from e
    if not isinstance(payload, dict):
        raise InvalidPayload(
            "body", f"must be a JSON object with instances, inputs or values, e.g. {_EXAMPLE}"
        )
    return payload


def parse_request(
    payload: Mapping[str, Any], signatures: Mapping[str, SignatureInfo]
) -> ScoringRequest:
    """Check `payload` against the signature it names; raises InvalidPayload."""
    unknown = sorted(set(payload) - _KNOWN_KEYS)
    if unknown:
        raise InvalidPayload(
            f"/{unknown[0]}",
            "is not part of a prediction request (instances, inputs or "
            "values, and optionally signature_name)",
        )
    signature = _signature(payload.get("signature_name", SERVING_SIGNATURE), signatures)
    forms = [f for f in _FORMS if f in payload]
    if len(forms) != 1:
        problem = "has none" if not forms else f"has {' and '.join(forms)}"
        raise InvalidPayload("body", f"needs exactly one of instances, inputs or values; {problem}")
    form = PayloadForm(forms[0])
    if "fields" in payload and form != PayloadForm.VALUES:
        raise InvalidPayload("/fields", "goes only with values")
    if form == PayloadForm.INPUTS:
        tensors, rows = _columnar(payload["inputs"], signature)
    else:
        if not signature.batchable:
            raise InvalidPayload(
                f"/{form}",
                f"signature '{signature.name}' has no batch dimension on every input and "
                'output; send the columnar form {"inputs": ...}',
            )
        if form == PayloadForm.INSTANCES:
            tensors, rows = _rows(payload["instances"], signature, "/instances")
        else:
            tensors, rows = _wml_values(payload["values"], payload.get("fields"), signature)
    return ScoringRequest(form, signature, tensors, rows)


def signature_of(name: str, signatures: Mapping[str, SignatureInfo]) -> SignatureInfo:
    """The signature `name` (default serving_default when empty); InvalidPayload naming
    /signature_name if the model has none such."""
    return _signature(name or SERVING_SIGNATURE, signatures)


def tensors_request(signature: SignatureInfo, tensors: dict[str, np.ndarray]) -> ScoringRequest:
    """A request that comes as one array per input already (gRPC's PredictRequest.inputs,
    the columnar form): checked for missing and unknown inputs, each input's shape and the
    shared first dimension as the JSON forms are. Dtypes are the caller's to check."""
    for name in tensors:
        if name not in signature.inputs:
            raise InvalidPayload(
                f"/inputs/{name}",
                f"is not an input of signature '{signature.name}' ({_input_names(signature)})",
            )
    for name, info in signature.inputs.items():
        if name not in tensors:
            raise InvalidPayload(f"/inputs/{name}", "is required")
        check_shape(tensors[name], info, f"/inputs/{name}", batch=False)
    return ScoringRequest(
        PayloadForm.INPUTS, signature, tensors, _columnar_rows(tensors, signature)
    )


def render(request: ScoringRequest, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The answer to `request`, in the form it was asked in (numbers stay numpy arrays
    until `encode_answer` writes them)."""
    names = [n for n in request.signature.outputs if n in outputs] or sorted(outputs)
    columns = {n: json_ready(np.asarray(outputs[n])) for n in names}
    if request.form == PayloadForm.INPUTS:
        return {"outputs": columns[names[0]] if len(names) == 1 else columns}
    if request.form == PayloadForm.INSTANCES:
        if len(names) == 1:
            return {"predictions": columns[names[0]]}
        return {"predictions": [{n: columns[n][i] for n in names} for i in range(request.rows)]}
    return {
        "fields": names,
        "values": [[columns[n][i] for n in names] for i in range(request.rows)],
    }


def _signature(name: Any, signatures: Mapping[str, SignatureInfo]) -> SignatureInfo:
    if not isinstance(name, str):
        raise InvalidPayload("/signature_name", "must be a string")
    if name not in signatures:
        known = ", ".join(sorted(signatures)) or "none"
        raise UnknownSignature("/signature_name", f"the model has no signature '{name}' ({known})")
    return signatures[name]


def _input_names(signature: SignatureInfo) -> str:
    return ", ".join(signature.inputs)


def _rows(
    instances: Any, signature: SignatureInfo, field: str
) -> tuple[dict[str, np.ndarray], int]:
    if not isinstance(instances, list):
        raise InvalidPayload(field, "must be a list with one entry per instance")
    if not instances:
        raise InvalidPayload(field, "is empty; send at least one instance")
    inputs = signature.inputs
    # An object is an instance naming its inputs, unless it is a {"b64": ...} value.
    named = [isinstance(i, dict) and set(i) != {"b64"} for i in instances]
    if len(inputs) == 1 and not any(named):
        info = next(iter(inputs.values()))
        return {info.name: to_array(instances, info, field, batch=True)}, len(instances)
    if not all(named):
        bad = named.index(False)
        raise InvalidPayload(
            f"{field}/{bad}", f"must be an object with the inputs {_input_names(signature)}"
        )
    columns: dict[str, list[Any]] = {name: [] for name in inputs}
    for i, instance in enumerate(instances):
        for key in instance:
            if key not in inputs:
                raise InvalidPayload(
                    f"{field}/{i}/{key}",
                    f"is not an input of signature '{signature.name}' ({_input_names(signature)})",
                )
        for name, column in columns.items():
            if name not in instance:
                raise InvalidPayload(f"{field}/{i}/{name}", "is required")
            column.append(instance[name])
    tensors = {
        name: to_array(column, inputs[name], f"{field}/*/{name}", batch=True)
        for name, column in columns.items()
    }
    return tensors, len(instances)


def _columnar(value: Any, signature: SignatureInfo) -> tuple[dict[str, np.ndarray], int]:
    inputs = signature.inputs
    if len(inputs) == 1:
        (name,) = inputs
        if isinstance(value, dict) and set(value) != {name}:
            raise InvalidPayload(
                "/inputs", f"the only input of signature '{signature.name}' is '{name}'"
            )
        columns = value if isinstance(value, dict) else {name: value}
    else:
        if not isinstance(value, dict):
            raise InvalidPayload("/inputs", f"must be an object naming {_input_names(signature)}")
        for key in value:
            if key not in inputs:
                raise InvalidPayload(
                    f"/inputs/{key}",
                    f"is not an input of signature '{signature.name}' ({_input_names(signature)})",
                )
        columns = value
    tensors: dict[str, np.ndarray] = {}
    for name, info in inputs.items():
        if name not in columns:
            raise InvalidPayload(f"/inputs/{name}", "is required")
        tensors[name] = to_array(columns[name], info, f"/inputs/{name}", batch=False)
    return tensors, _columnar_rows(tensors, signature)


def _columnar_rows(tensors: Mapping[str, np.ndarray], signature: SignatureInfo) -> int:
    """Instances in a columnar request: the inputs' shared first dimension (1 for a
    signature without a batch dimension)."""
    if not signature.batchable:
        return 1
    sizes = {name: t.shape[0] for name, t in tensors.items()}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{n}: {s}" for n, s in sizes.items())
        raise InvalidPayload("/inputs", f"inputs must share their first dimension ({listed})")
    rows: int = next(iter(sizes.values()))
    if rows == 0:
        raise InvalidPayload("/inputs", "is empty; send at least one instance")
    return rows


def _wml_values(
    values: Any, fields: Any, signature: SignatureInfo
) -> tuple[dict[str, np.ndarray], int]:
    if fields is None:
        if len(signature.inputs) != 1:
            raise InvalidPayload(
                "/fields",
                f"is required: signature '{signature.name}' has several inputs "
                f"({_input_names(signature)})",
            )
        return _rows(values, signature, "/values")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise InvalidPayload("/fields", "must be a list of input names")
    if sorted(fields) != sorted(signature.inputs):
        raise InvalidPayload(
            "/fields",
            f"must name each input of signature '{signature.name}' once "
            f"({_input_names(signature)})",
        )
    if not isinstance(values, list):
        raise InvalidPayload("/values", "must be a list with one row per instance")
    instances = []
    for i, row in enumerate(values):
        if not isinstance(row, list) or len(row) != len(fields):
            raise InvalidPayload(f"/values/{i}", f"must be a list of {len(fields)} values")
        instances.append(dict(zip(fields, row, strict=True)))
    return _rows(instances, signature, "/values")
