"""The client's one exception hierarchy.

Every error the API answers is RFC 9457 problem+json; `error_from_response` turns it into
the `ApiError` subclass of its status, carrying the problem's title, detail and the list of
offending fields. Errors that never reached the API are `ConnectionFailed`; a `wait` that
runs out of time is `WaitTimeout`. Catch `DlaasError` to handle them all.

    DlaasError
    ├── ConnectionFailed          the API could not be reached (or did not answer in time)
    ├── WaitTimeout               wait() gave up (also a TimeoutError)
    └── ApiError                  the API refused the request (problem+json)
        ├── BadRequest            400
        ├── Unauthorized          401: no API key, or not a valid one
        ├── Forbidden             403: e.g. a tenant key on an admin endpoint
        ├── NotFound              404: no such training/deployment (or another tenant's)
        ├── Conflict              409: e.g. stopping a training that already ended
        ├── PayloadTooLarge       413: the upload is above the platform's limit
        ├── ValidationError       422: `errors` names every offending field
        ├── RateLimited           429: `retry_after` seconds, if the API said
        └── ServerError           5xx
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class FieldError:
    """One offending field: a JSON pointer into what was sent (`/compute_configuration/nodes`)
    or a request part (`model_definition`), and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class DlaasError(Exception):
    """Base of every error the client raises. `message` is the sentence to show a person."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConnectionFailed(DlaasError):
    """The API could not be reached, or did not answer in time."""


class WaitTimeout(DlaasError, TimeoutError):
    """`wait` gave up before the training or deployment reached a final state."""

    def __init__(self, message: str, last: Any = None) -> None:
        super().__init__(message)
        self.last = last  # the last state seen (a Training or Deployment)


class ApiError(DlaasError):
    """The API refused the request; the fields mirror its problem+json document."""

    status: int = 0

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        type: str = "about:blank",
        errors: list[FieldError] | None = None,
        problem: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type
        self.errors = list(errors or [])
        self.retry_after = retry_after
        self.problem: dict[str, Any] = problem or {
            "type": type,
            "title": title,
            "status": status,
            "detail": detail,
            **({"errors": [e.__dict__ for e in self.errors]} if self.errors else {}),
        }
        super().__init__(f"{title} (HTTP {status}): {detail}" if detail else title)

    @property
    def fields(self) -> list[str]:
        """The offending fields' names, in the order the API listed them."""
        return [e.field for e in self.errors]


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class PayloadTooLarge(ApiError):
    status = 413


class ValidationError(ApiError):
    status = 422


class RateLimited(ApiError):
    status = 429


class ServerError(ApiError):
    status = 500


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
    429: RateLimited,
}


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None  # an HTTP date: rare enough that the caller decides


def error_from_response(response: httpx.Response) -> ApiError:
    """The ApiError for a refused response (its body read), problem+json or not."""
    status = response.status_code
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    try:
        body = json.loads(response.content) if response.content else None
    except ValueError:
        body = None
    problem = body if isinstance(body, dict) else None
    if problem is not None:
        raw_errors = problem.get("errors")
        errors = [
            FieldError(str(e.get("field", "")), str(e.get("message", "")))
            for e in (raw_errors if isinstance(raw_errors, list) else [])
            if isinstance(e, dict)
        ]
        title = str(problem.get("title") or response.reason_phrase or "Error")
        detail = str(problem.get("detail") or "")
        type_ = str(problem.get("type") or "about:blank")
    else:
        errors = []
        title = response.reason_phrase or "Error"
        detail = response.text.strip()[:500]
        type_ = "about:blank"
    return cls(
        status,
        title,
        detail,
        type=type_,
        errors=errors,
        problem=problem,
        retry_after=_retry_after(response.headers.get("retry-after")),
    )
