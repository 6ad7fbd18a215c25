"""Where learners run: one Backend protocol (base), local processes or Kubernetes pods."""

from __future__ import annotations

from service.settings import Settings
from worker.backends.base import Backend


def make_backend(settings: Settings) -> Backend:
    if settings.backend == "local":
        from worker.backends.local import LocalBackend

        return LocalBackend(
            settings.work_dir,
            slots=settings.local_slots,
            stop_grace_seconds=settings.stop_grace_seconds,
            use_namespaces=settings.local_namespaces,
            use_sandbox=settings.local_sandbox,
            hidden=(settings.home_dir,),
            store_attempts=settings.store_retry_attempts,
            store_retry_seconds=settings.store_retry_seconds,
        )
    if settings.backend == "kubernetes":
        from worker.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend.from_settings(settings)
    raise NotImplementedError(
        f"DLAAS_BACKEND={settings.backend} is not built yet; use DLAAS_BACKEND=local"
    )
