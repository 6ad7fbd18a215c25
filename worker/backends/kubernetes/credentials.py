"""What the Kubernetes backend asks of the platform's store credentials before it starts.

Learner pods run tenants' code on a shared cluster: the store credentials in a training's
Secret must reach only that training's keys, which takes a role to assume
(DLAAS_STORE_ROLE_ARN: service.storage.scoped). Without one, the backend refuses to start,
naming the setting, unless the operator accepts, with
DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true, that every learner pod gets the platform's
own credentials (the whole bucket); that is logged once, when the backend starts.
"""

from __future__ import annotations

import logging

from service.settings import Settings

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
