"""Typed errors a user can act on. One handler (service.http.problems) renders them as
RFC 9457 problem+json, so domain code never builds HTTP responses itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    """One offending field, as a JSON pointer into the submitted document."""

    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


class DlaasError(Exception):
    status: int = 400
    title: str = "Bad request"
    slug: str = "bad-request"

    def __init__(self, detail: str, *, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors or []
        # Response headers that go with the problem (Retry-After on a 429).
        self.headers: dict[str, str] = {}


class ValidationFailed(DlaasError):
    status = 422
    title = "Validation failed"
    slug = "validation-failed"

    def __init__(self, errors: list[FieldError], detail: str | None = None) -> None:
        summary = detail or "; ".join(f"{e.field}: {e.message}" for e in errors)
        super().__init__(summary, errors=errors)


class BadRequest(DlaasError):
    status = 400
    title = "Bad request"
    slug = "bad-request"


class Unauthorized(DlaasError):
    status = 401
    title = "Unauthorized"
    slug = "unauthorized"


class Forbidden(DlaasError):
    status = 403
    title = "Forbidden"
    slug = "forbidden"


class NotFound(DlaasError):
    status = 404
    title = "Not found"
    slug = "not-found"


class UnknownVersion(NotFound):
    """A model version or version label the deployment does not have (TensorFlow Serving's
    NOT_FOUND: "Servable not found for request: Specific(<name>, <version>)")."""

    title = "Unknown model version"
    slug = "unknown-model-version"


class Conflict(DlaasError):
    status = 409
    title = "Conflict"
    slug = "conflict"


class PayloadTooLarge(DlaasError):
    status = 413
    title = "Payload too large"
    slug = "payload-too-large"


class TooManyRequests(DlaasError):
    status = 429
    title = "Too many requests"
    slug = "too-many-requests"

    def __init__(
        self, detail: str, *, retry_after: int, errors: list[FieldError] | None = None
    ) -> None:
        super().__init__(detail, errors=errors)
        self.retry_after = retry_after
        self.headers["Retry-After"] = str(retry_after)


class LimitExceeded(DlaasError):
    """A limit of the tenant's plan is reached: the problem names the limit (`errors[0]
    .field`), what the plan allows and what the tenant uses now. No Retry-After: the
    request succeeds once the tenant uses less, not after a time."""

    status = 429
    title = "Plan limit reached"
    slug = "plan-limit-reached"

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(detail, errors=[FieldError(limit, detail)])


class ServiceUnavailable(DlaasError):
    status = 503
    title = "Service unavailable"
    slug = "service-unavailable"
