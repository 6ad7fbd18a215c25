"""What the handlers of TensorFlow Serving's gRPC API share: the caller's key from the
call's metadata, the version a ModelSpec asks for, the ModelSpec of an answer, the rate
limit's trailing metadata, and the gRPC status code of a refusal."""

from __future__ import annotations

from typing import Any

import grpc
from grpc import aio

from service.errors import DlaasError
from service.http.auth import key_of_header
from service.http.serving_errors import serving_code
from service.scoring.ratelimit import RateDecision


def status_code(error: DlaasError) -> grpc.StatusCode:
    """TensorFlow Serving's gRPC status code for `error`."""
    return grpc.StatusCode[serving_code(error)]


def api_key(context: aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return key_of_header(value if isinstance(value, str) else value.decode())
    return key_of_header("")


def requested_version(spec: Any) -> tuple[int | None, str | None]:
    """The version (`model_spec.version`) or label (`model_spec.version_label`) a
    ModelSpec asks for; (None, None) for the default."""
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return int(spec.version.value), None
    if choice == "version_label":
        return None, str(spec.version_label)
    return None, None


def fill_spec(into: Any, name: str, version: int, signature: str = "") -> None:
    """An answer's ModelSpec: the model's name as asked, the version that answered and
    the signature it ran."""
    into.name = name
    into.version.value = version
    if signature:
        into.signature_name = signature


def rate_metadata(context: aio.ServicerContext, decision: RateDecision) -> None:
    context.set_trailing_metadata(
        (
            ("x-ratelimit-limit", str(decision.limit)),
            ("x-ratelimit-remaining", str(decision.remaining)),
        )
    )
