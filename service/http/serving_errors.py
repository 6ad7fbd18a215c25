"""Refusals in TensorFlow Serving's terms, for the paths its clients call (the scoring
service's gRPC API and the REST paths under /v1/models): the status code TensorFlow
Serving gives, and the `{"error": "..."}` body its REST API answers with.

A refusal is first a gRPC status code (what TensorFlow Serving's server returns); over
REST that code becomes the HTTP status TensorFlow Serving's HTTP server maps it to (its
http_server.cc), so both surfaces refuse alike. The platform's own routes keep
problem+json (service.http.problems).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from service.errors import DlaasError

# An HTTP problem's status as the gRPC status code that means the same to a client.
_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "FAILED_PRECONDITION",
    413: "RESOURCE_EXHAUSTED",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    502: "INTERNAL",
    503: "UNAVAILABLE",
}
# TensorFlow Serving's HTTP status of each gRPC status code.
HTTP_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}


def serving_code(error: DlaasError) -> str:
    """The name of the gRPC status code TensorFlow Serving answers `error` with: the
    error's own `serving_code` where it has one (an unknown signature is
    FAILED_PRECONDITION, though a 400 on the platform's route), else its HTTP status's."""
    own = getattr(error, "serving_code", None)
    if isinstance(own, str) and own in HTTP_STATUS:
        return own
    if error.status in _CODES:
        return _CODES[error.status]
    return "INTERNAL" if error.status >= 500 else "INVALID_ARGUMENT"


def serving_error(error: DlaasError) -> JSONResponse:
    """TensorFlow Serving's REST answer to a refused request: `{"error": detail}`, with
    the HTTP status of its gRPC code, and the error's headers (Retry-After)."""
    headers = dict(error.headers)
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(
        {"error": error.detail},
        status_code=HTTP_STATUS[serving_code(error)],
        headers=headers or None,
    )
