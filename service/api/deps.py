"""Dependencies every router shares: the platform, a database session, the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Concatenate, ParamSpec, TypeVar

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session

from service.auth import TenantRef, hash_api_key, keys_match
from service.db import repository
from service.db.models import Training
from service.db.session import server_connect_args
from service.errors import Forbidden, NotFound, Unauthorized
from service.http.app import PlatformDep
from service.http.auth import authenticate, caller_key

P = ParamSpec("P")
T = TypeVar("T")


def get_session(platform: PlatformDep) -> Iterator[Session]:
    """A session per request; routers commit what they change, anything else rolls back."""
    with platform.sessions() as session:
        try:
            yield session
        finally:
            session.rollback()


SessionDep = Annotated[Session, Depends(get_session)]


async def current_tenant(request: Request, platform: PlatformDep) -> TenantRef:
    """The caller, from the key cache without leaving the event loop when it can (a
    worker-thread hop costs more than a cached lookup), else from the database."""
    key = caller_key(request)
    key_hash = hash_api_key(key)
    cached = platform.tenant_keys.get(key_hash)
    if cached is not None:
        return cached
    return await run_in_threadpool(authenticate, platform, key)


def require_admin(request: Request, platform: PlatformDep, session: SessionDep) -> None:
    key = caller_key(request)
    if keys_match(key, platform.admin_key):
        return
    if repository.tenant_for_key_hash(session, hash_api_key(key)) is not None:
        raise Forbidden("this endpoint needs the admin API key")
    raise Unauthorized("the API key is not valid")


async def key_owner(tenant_id: str, request: Request, platform: PlatformDep) -> str:
    """The tenant whose API keys the caller manages (`/v1/tenants/{tenant_id}/keys`): any
    tenant with the admin key, its own with a tenant's key. Another tenant's is as absent
    as a missing one (404)."""
    key = caller_key(request)
    if keys_match(key, platform.admin_key):
        return tenant_id
    caller = await current_tenant(request, platform)
    if caller.id != tenant_id:
        raise NotFound(f"tenant {tenant_id} not found")
    return tenant_id


CurrentTenant = Annotated[TenantRef, Depends(current_tenant)]
AdminOnly = Depends(require_admin)
KeyOwner = Annotated[str, Depends(key_owner)]


class LoopReads:
    """Short database reads run for the event loop without a worker thread.

    On SQLite, a file in this process, a read runs right on the loop: a point read costs
    less than the hop to a worker thread and back, and under load the threads' contention
    for the GIL costs more than the read. On a server database it runs through an async
    engine (psycopg's async mode), so the loop serves other requests while the query is on
    the network. Either way the read is the same blocking code, handed a Connection
    (`AsyncConnection.run_sync` runs it in a greenlet). Measured on GET
    /v1/trainings/{id} at concurrency 32: 2.7x the requests/s of a worker-thread hop on
    SQLite (see benchmarks/api.py for PostgreSQL).

    Made in an app's lifespan, on the loop that uses it, and closed with it.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._async: AsyncEngine | None = None
        if engine.dialect.name != "sqlite":
            # AUTOCOMMIT: no BEGIN and ROLLBACK round trips around a read (on PostgreSQL's
            # READ COMMITTED each statement sees its own snapshot anyway). No pre-ping
            # round trip either: a connection found dead is retried once (see __call__).
            # No overflow: connections above pool_size are closed when given back, and
            # opening one (a server process, authentication) costs far more than the
            # wait for a pooled one.
            self._async = create_async_engine(
                engine.url,
                isolation_level="AUTOCOMMIT",
                pool_size=16,
                max_overflow=0,
                connect_args=server_connect_args(engine.url),
            )

    async def __call__(
        self,
        function: Callable[Concatenate[Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        if self._async is None:
            with self.engine.connect() as conn:
                return function(conn, *args, **kwargs)
        try:
            async with self._async.connect() as aconn:
                return await aconn.run_sync(function, *args, **kwargs)
        except DBAPIError as e:
            if not e.connection_invalidated:
                raise
        # The server closed a pooled connection (a restart): the pool was emptied; the
        # read runs again, once, on a new connection.
        async with self._async.connect() as aconn:
            return await aconn.run_sync(function, *args, **kwargs)

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.dispose()


def owned_training(session: Session, tenant: TenantRef, training_id: str) -> Training:
    """The caller's training; another tenant's is as absent as a missing one (404)."""
    training = repository.get_training(session, tenant.id, training_id)
    if training is None:
        raise NotFound(f"training {training_id} not found")
    return training
