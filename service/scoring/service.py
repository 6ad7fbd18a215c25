"""The scoring service of one process: deploys models, keeps them loaded, answers
predictions within the tenants' rate limits.

It runs inside the API process (embedded, the default) or alone (`python -m
service.scoring`, DLAAS_SCORING_URL on the API), where it scales separately. Either way a
loop looks for DEPLOYING deployments in the database (the API only writes that intent),
copies the training's SavedModel to the deployment's own place in the object store, starts
its model process (service.scoring.process: sandboxed, the SavedModel checked for
operations it may not use before it is loaded, then loaded and warmed up), and records
READY with its signatures, or FAILED with the reason. Several scoring processes may do
this for the same deployment; the first to finish records it. Models of READY deployments
are started in the background when the process starts, restarted when their process exits
(reported in the deployment's status_message), and stopped when their deployment is
deleted. This process never imports TensorFlow.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from service.auth import TenantRef, hash_api_key
from service.db import repository
from service.deployments import scoring_target, serving_state
from service.domain.deployments import (
    DEPLOYMENT_RULE,
    MODEL_MARKERS,
    SERVING_SIGNATURE,
    DeploymentState,
    ScoringTarget,
)
from service.domain.signature import signatures_to_json
from service.domain.versions import VersionState, deployment_outcome
from service.errors import (
    BadRequest,
    FieldError,
    Forbidden,
    ServiceUnavailable,
    TooManyRequests,
    UnknownVersion,
)
from service.http.auth import authenticate
from service.platform import Platform
from service.scoring.batching import ModelUnloaded, Tensors
from service.scoring.cache import (
    BatchingConfig,
    ModelCache,
    ModelKey,
    fetch_tree,
    has_model,
    upload_tree,
)
from service.scoring.inputs import ScoringRequest, decode_body, parse_request, render
from service.scoring.process import ModelInputError, ModelProblem, ProcessConfig
from service.scoring.ratelimit import RateDecision, make_rate_limiter
from service.scoring.versions import resolve_version
from service.storage import keys
from service.ttlcache import TtlCache

log = logging.getLogger("dlaas.scoring")

_MAX_REASON = 600
# `targets` keys of deployments asked for by name (ids never hold a colon).
_NAMED = "name:"


def _nothing() -> None:
    return None


class DeployFailed(Exception):
    """Why a deployment cannot serve, in words for its status_message."""


def _reason(error: BaseException) -> str:
    if isinstance(error, DeployFailed | ModelProblem):
        text = str(error)
        return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."
    first = (str(error).strip().splitlines() or [""])[0]
    text = f"the model could not be loaded: {type(error).__name__}: {first}"
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def _retarget(target: ScoringTarget, version: int | None, label: str | None) -> ScoringTarget:
    if version is None and label is None:
        return target
    return target.at(resolve_version(target, version, label))


class ScoringService:
    def __init__(self, platform: Platform) -> None:
        settings = platform.settings
        self.platform = platform
        self.cache = ModelCache(
            platform.store,
            settings.scoring_dir,
            BatchingConfig(
                enabled=settings.scoring_batching,
                max_batch_size=settings.scoring_max_batch_size,
                max_wait=settings.scoring_max_wait_ms / 1000,
                threads=settings.resolved_scoring_threads,
            ),
            ProcessConfig(
                connections=settings.resolved_scoring_threads,
                call_timeout=settings.scoring_call_timeout,
                allow_unsandboxed=settings.allow_unsandboxed,
                hidden=(str(settings.home_dir),),
            ),
            self.report,
        )
        self.limiter = make_rate_limiter(settings.resolved_rate_limit_url)
        # (API key hash, deployment) -> the caller and its READY deployment, for 2 s, so the
        # steady stream of predictions does not ask the database about every one.
        # Deleting a deployment in this process forgets it at once; a separate scoring
        # process stops answering for it within the ttl.
        self.targets: TtlCache[tuple[str, str], tuple[TenantRef, ScoringTarget]] = TtlCache(2.0)
        self._jobs = ThreadPoolExecutor(2, thread_name_prefix="deploy")
        self._scheduled: set[ModelKey] = set()
        self._preloaded: set[ModelKey] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="scoring-loop", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        self._jobs.shutdown(wait=False, cancel_futures=True)
        self.cache.close()
        await self.limiter.close()

    def kick(self) -> None:
        """Look for work now (a deployment was created or deleted in this process)."""
        self._wake.set()

    def _loop(self) -> None:
        interval = self.platform.settings.scoring_poll_interval
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception:
                log.exception("scoring: looking for deployments failed")
            self._wake.wait(interval)
            self._wake.clear()

    def reconcile(self) -> None:
        """Load the versions that are DEPLOYING, preload the loaded versions of READY and
        DEPLOYING deployments (`repository.serving_versions`), unload what is gone or
        unloaded, and settle deployments whose first versions all finished (a safety net
        for two processes finishing them at once)."""
        # Only models loaded before the query can be unloaded for not being READY in it.
        with self._lock:
            unloadable = set(self.cache.cached_ids()) - self._scheduled
        with self.platform.sessions() as session:
            deploying = [
                (v.deployment_id, v.version) for v in repository.deploying_versions(session)
            ]
            ready = {
                (v.deployment_id, v.version): v.model_key
                for v in repository.serving_versions(session)
            }
            unsettled = [
                d.id for d in repository.deployments_in_status(session, DeploymentState.DEPLOYING)
            ]
        for key in deploying:
            self._schedule(key, self.deploy_version, *key)
        for key, model_key in ready.items():
            if key not in self._preloaded:
                self._preloaded.add(key)
                self._schedule(key, self._preload, key, model_key)
        for key in unloadable - set(ready):
            self._preloaded.discard(key)
            self.forget(*key)
        pending = {key[0] for key in deploying}
        for deployment_id in unsettled:
            if deployment_id not in pending:
                self._settle(deployment_id)

    def _schedule(self, key: ModelKey, job: Any, *args: Any) -> None:
        with self._lock:
            if key in self._scheduled:
                return
            self._scheduled.add(key)

        def run() -> None:
            try:
                job(*args)
            except Exception:
                log.exception("scoring: job for deployment %s version %s failed", *key)
            finally:
                with self._lock:
                    self._scheduled.discard(key)

        self._jobs.submit(run)

    # ---- deploying ----

    def deploy(self, deployment_id: str) -> None:
        """Load every version of the deployment that is DEPLOYING, one after the other."""
        with self.platform.sessions() as session:
            numbers = [
                v.version
                for v in repository.deployment_versions(session, deployment_id)
                if v.state == VersionState.DEPLOYING
            ]
        for number in numbers:
            self.deploy_version(deployment_id, number)

    def deploy_version(self, deployment_id: str, number: int) -> None:
        """Copy a DEPLOYING version's SavedModel to the deployment's place, start its model
        process, and record the version READY (with its signatures) or FAILED (with the
        reason); a deployment whose first versions have all finished is READY when one of
        them loaded, else FAILED."""
        key = (deployment_id, number)
        with self.platform.sessions() as session:
            version = repository.deployment_version(session, deployment_id, number)
            if version is None or version.state != VersionState.DEPLOYING:
                return
            training_id, source, model_key = (
                version.training_id,
                version.source_key,
                version.model_key,
            )
        signatures: dict[str, Any] | None = None
        try:
            self._store_model(key, training_id, source, model_key)
            served = self.cache.load(key, model_key, retry=True)
            if SERVING_SIGNATURE not in served.signatures:
                found = ", ".join(served.signatures) or "none"
                raise DeployFailed(
                    f"the SavedModel has no '{SERVING_SIGNATURE}' signature (it has: "
                    f"{found}); {DEPLOYMENT_RULE}"
                )
            signatures = signatures_to_json(served.signatures)
            state, message = VersionState.READY, None
        except Exception as e:
            if self._stop.is_set():  # not the model's fault: another process deploys it
                log.info("scoring: stopped while deploying %s version %s", *key)
                return
            log.warning("scoring: deployment %s version %s failed: %s", *key, e)
            self.cache.forget(*key)
            state, message = VersionState.FAILED, _reason(e)
        with self.platform.sessions() as session:
            recorded = repository.finish_version(
                session, deployment_id, number, state=state, message=message, signatures=signatures
            )
            session.commit()
            gone = not recorded and repository.deployment_version(session, *key) is None
        if gone:  # deleted while it was loading: leave nothing behind
            self.cache.forget(*key)
            if self._deployment_gone(deployment_id):
                self.platform.store.delete_prefix(keys.deployment_prefix(deployment_id))
            return
        self.targets.forget(lambda cached: cached[1] == deployment_id)
        self._settle(deployment_id)

    def _deployment_gone(self, deployment_id: str) -> bool:
        with self.platform.sessions() as session:
            return repository.deployment_by_id(session, deployment_id) is None

    def _settle(self, deployment_id: str) -> None:
        """Record a DEPLOYING deployment READY or FAILED once its versions have finished."""
        with self.platform.sessions() as session:
            deployment = repository.deployment_by_id(session, deployment_id)
            if deployment is None or deployment.status != DeploymentState.DEPLOYING:
                return
            rows = repository.deployment_versions(session, deployment_id)
            outcome = deployment_outcome(
                {v.version: VersionState(v.state) for v in rows},
                {v.version: v.status_message for v in rows},
            )
            if outcome is None:
                return
            status, message = outcome
            loaded = [v for v in rows if v.state == VersionState.READY]
            signatures = max(loaded, key=lambda v: v.version).signatures if loaded else None
            repository.finish_deploying(
                session, deployment_id, status=status, message=message, signatures=signatures
            )
            session.commit()

    def _store_model(self, key: ModelKey, training_id: str, source: str, model_key: str) -> None:
        """Copy the training's model (a SavedModel or model.onnx) to the deployment's own
        place, once."""
        store = self.platform.store
        if any(store.stat(f"{model_key}{marker}") is not None for marker in MODEL_MARKERS):
            return
        local = self.cache.local_dir(key)
        # '': version 1 of a deployment made before versions (migration 0007) came from the
        # training's model/ SavedModel.
        source = source or keys.saved_model_prefix(training_id)
        if not has_model(local) and not fetch_tree(store, source, local):
            raise DeployFailed(
                f"the results of training {training_id} no longer hold a model "
                "(was the training deleted?)"
            )
        upload_tree(store, local, model_key)

    def _preload(self, key: ModelKey, model_key: str) -> None:
        self.cache.load(key, model_key, retry=True)

    def report(self, key: ModelKey, message: str) -> None:
        """What happened to a loaded version's model process: logged, and kept as its
        status_message (and the deployment's)."""
        deployment_id, number = key
        log.warning("scoring: deployment %s version %s: %s", deployment_id, number, message)
        try:
            with self.platform.sessions() as session:
                reason = _reason(ModelProblem(message))
                repository.note_version(session, deployment_id, number, reason)
                repository.note_deployment(session, deployment_id, reason)
                session.commit()
        except Exception:
            log.exception("scoring: recording what happened to deployment %s failed", deployment_id)

    def forget(self, deployment_id: str, version: int | None = None) -> None:
        """Stop serving the deployment (every version, or one) in this process."""
        # Names are remembered apart from ids: every name is forgotten with any deployment.
        self.targets.forget(lambda key: key[1] == deployment_id or key[1].startswith(_NAMED))
        self.cache.forget(deployment_id, version)
        with self._lock:
            self._preloaded = {
                key
                for key in self._preloaded
                if key[0] != deployment_id or version not in (None, key[1])
            }

    def refresh(self, deployment_id: str) -> None:
        """Read the deployment's versions and labels again at its next request (a label
        moved, a version was added)."""
        self.targets.forget(lambda key: key[1] == deployment_id or key[1].startswith(_NAMED))

    # ---- predictions ----

    def plan_limit(self, tenant: TenantRef) -> int:
        plan = self.platform.catalog.plans.get(tenant.plan)
        if plan is None:
            raise Forbidden(f"the plan '{tenant.plan}' is not in the catalog; ask the operator")
        return plan.predictions_per_minute

    @contextmanager
    def arriving(self, deployment_id: str) -> Iterator[Callable[[], None]]:
        """Announce a request to the deployment's batchers (see batching.Arrivals) until
        it calls the yielded function, which `predict` does once it has submitted it."""
        arrivals = self.cache.arrivals(deployment_id)
        if arrivals is None:
            yield _nothing
            return
        with arrivals.coming() as arrived:
            yield arrived

    async def caller(
        self,
        key: str,
        deployment_id: str,
        version: int | None = None,
        label: str | None = None,
        *,
        by_name: bool = False,
    ) -> tuple[TenantRef, ScoringTarget]:
        """The tenant whose API key `key` is and its READY deployment `deployment_id` (with
        `by_name`, its id or its name, as TensorFlow Serving's clients name models), the
        target of the version the request asks for (`version`, `label`, or neither: see
        service.scoring.versions.resolve_version): remembered (`targets`), or asked of the
        database in a worker thread. Raises what the REST and gRPC answers both render
        (401, 403, 404 also for an unknown version or label, 409)."""
        key_hash = hash_api_key(key)
        found = self.targets.get((key_hash, deployment_id))
        if found is None and by_name:
            found = self.targets.get((key_hash, _NAMED + deployment_id))
        if found is None:
            found = await asyncio.to_thread(self._authorize, key, key_hash, deployment_id, by_name)
        tenant, target = found
        if version is None and label is None:  # read for the default version
            return found
        return tenant, target.at(resolve_version(target, version, label))

    def _authorize(
        self, key: str, key_hash: str, deployment_id: str, by_name: bool = False
    ) -> tuple[TenantRef, ScoringTarget]:
        tenant = authenticate(self.platform, key)
        with self.platform.sessions() as session:
            target = scoring_target(session, tenant, deployment_id, by_name=by_name)
        found = (tenant, target)
        self.targets.put((key_hash, target.id), found)
        if target.id != deployment_id:  # asked for by its name
            self.targets.put((key_hash, _NAMED + deployment_id), found)
        return found

    async def state_of(
        self, key: str, name: str
    ) -> tuple[ScoringTarget, DeploymentState, str | None]:
        """The caller's deployment `name` (id or name) in any state, its state and status
        message (a model status request; never remembered, so a change shows at once)."""

        def look() -> tuple[ScoringTarget, DeploymentState, str | None]:
            tenant = authenticate(self.platform, key)
            with self.platform.sessions() as session:
                return serving_state(session, tenant, name)

        return await asyncio.to_thread(look)

    async def predict(
        self,
        tenant: TenantRef,
        target: ScoringTarget,
        body: bytes,
        arrived: Callable[[], None] | None = None,
        *,
        version: int | None = None,
        label: str | None = None,
    ) -> tuple[dict[str, Any], RateDecision]:
        """The answer to a prediction request, and the rate limit it was counted against;
        `version` or `label` as in `score`."""
        target = _retarget(target, version, label)
        request = parse_request(decode_body(body), target.signatures)
        outputs, decision = await self.score(tenant, request, target, arrived)
        return render(request, outputs), decision

    async def score(
        self,
        tenant: TenantRef,
        request: ScoringRequest,
        target: ScoringTarget,
        arrived: Callable[[], None] | None = None,
        *,
        version: int | None = None,
        label: str | None = None,
    ) -> tuple[dict[str, np.ndarray], RateDecision]:
        """The model's outputs for a checked request, within the tenant's rate limit (the
        one path of REST and gRPC predictions), and the limit it was counted against. The
        target's version answers (`caller` resolved the one the request asked for), or the
        one `version` or `label` names, where given (`resolve_version`)."""
        target = _retarget(target, version, label)
        limit = self.plan_limit(tenant)
        if request.rows > limit:
            field = f"/{request.form}"
            message = (
                f"{request.rows} instances are more than the {limit} predictions a minute "
                f"of the {tenant.plan} plan; send fewer per request"
            )
            raise BadRequest(f"{field}: {message}", errors=[FieldError(field, message)])
        decision = await self.limiter.acquire(tenant.id, limit, request.rows)
        if not decision.allowed:
            raise TooManyRequests(
                f"the {tenant.plan} plan allows {limit} predictions a minute; "
                f"{decision.remaining} are left in this minute and this request has "
                f"{request.rows}; retry in {decision.retry_after} s",
                retry_after=decision.retry_after,
            )
        outputs = await self._call(target, request, arrived or _nothing)
        return outputs, decision

    async def _call(
        self, target: ScoringTarget, request: ScoringRequest, arrived: Callable[[], None]
    ) -> dict[str, np.ndarray]:
        # Deleted, or this version unloaded, since the target was read.
        gone = UnknownVersion(
            f"deployment {target.id} not found, or its version {target.version} was unloaded"
        )
        key = (target.id, target.version)
        served = self.cache.cached(*key)
        if served is None:
            try:
                served = await asyncio.to_thread(self.cache.load, key, target.model_key)
            except FileNotFoundError as e:  # deleted meanwhile
                raise gone from e
            except ModelProblem as e:
                raise ServiceUnavailable(
                    f"deployment {target.id} cannot answer now: {_reason(e)}"
                ) from e
            except Exception as e:
                log.exception("scoring: loading deployment %s version %s failed", *key)
                raise ServiceUnavailable(
                    f"deployment {target.id} cannot answer now: {_reason(e)}"
                ) from e
        tensors: Tensors = request.tensors
        try:
            future = served.submit(request.signature.name, tensors, request.rows)
            arrived()
            return await asyncio.wrap_future(future)
        except ModelUnloaded as e:
            raise gone from e
        except ModelInputError as e:
            message = f"the model could not score these inputs: {e}"
            raise BadRequest(message, errors=[FieldError(f"/{request.form}", str(e))]) from e
