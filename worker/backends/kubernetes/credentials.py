"""What the Kubernetes backend asks of the platform's store credentials before it starts.

Learner pods run tenants' code on a shared cluster: the store credentials in a training's
Secret must reach only that training's keys, which takes a role to assume
(DLAAS_STORE_ROLE_ARN: service.storage.scoped). Without one, the backend refuses to start,
naming the setting, unless the operator accepts, with
DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true, that every learner pod gets the platform's
own credentials (the whole bucket); that is logged once, when the backend starts.

The logs' credentials: LogCredentials, below.
"""

from __future__ import annotations

import logging

from service.logs.config import LogSinkConfig
from service.logs.redis_users import RedisLogUsers
from service.settings import Settings
from worker.backends.base import StartRequest

log = logging.getLogger(__name__)


class StoreCredentialsRefused(RuntimeError):
    """The backend would hand learner pods the platform's own store credentials."""


def store_credentials_problem(settings: Settings) -> str | None:
    """Why the Kubernetes backend may not start with these settings' store credentials
    (None: it may)."""
    if settings.store_role_arn or settings.k8s_allow_platform_store_credentials:
        return None
    return (
        "DLAAS_STORE_ROLE_ARN is not set: learner pods would get the platform's own store "
        "credentials, which reach every training's keys; set DLAAS_STORE_ROLE_ARN to a role "
        "the platform's credentials may assume (STS AssumeRole at DLAAS_S3_ENDPOINT), or "
        "DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true to accept that"
    )


def check_store_credentials(settings: Settings) -> None:
    """Raise StoreCredentialsRefused (store_credentials_problem); with the explicit
    setting and no role, say once what the pods get."""
    problem = store_credentials_problem(settings)
    if problem is not None:
        raise StoreCredentialsRefused(problem)
    if not settings.store_role_arn:
        log.warning(
            "DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true and no DLAAS_STORE_ROLE_ARN: "
            "learner pods get the platform's own store credentials, not scoped to their "
            "training"
        )


class LogCredentials:
    """Each training's own log credentials for its pods: with a Redis log store, the URL of
    the training's ACL user (service.logs.redis_users), never the platform's Redis URL.
    Without `users` (a file sink, or tests) the learners get the request's sink as it is.

    A start calls `sink` (a new password of the user) before it makes the Secret, then
    `settle` (the Secret created: its password is the user's only one, an older attempt's
    stops working; the Secret there already, made by an earlier start: this start's
    password is taken back and the Secret's stays), or `take_back` when it fails. Cleanup
    calls `delete`."""

    def __init__(self, users: RedisLogUsers | None) -> None:
        self.users = users

    def sink(self, request: StartRequest) -> tuple[LogSinkConfig, str | None]:
        """The sink the training's learners write to, and the password it holds."""
        sink = request.log_sink
        if self.users is None or sink.kind != "redis":
            return sink, None
        url, password = self.users.grant(request.spec.training_id)
        return LogSinkConfig(kind="redis", url=url), password

    def settle(self, training_id: str, password: str | None, *, new_secret: bool) -> None:
        if self.users is None or password is None:
            return
        if new_secret:
            self.users.keep_only(training_id, password)
        else:
            self.users.revoke(training_id, password)

    def take_back(self, training_id: str, password: str | None) -> None:
        """After a failed start: no Secret of it holds the password any more. Best effort."""
        if self.users is None or password is None:
            return
        try:
            self.users.revoke(training_id, password)
        except Exception:
            log.exception("taking back the log password of %s's failed start failed", training_id)

    def delete(self, training_id: str) -> None:
        if self.users is not None:
            self.users.delete(training_id)

    def close(self) -> None:
        if self.users is not None:
            self.users.close()
