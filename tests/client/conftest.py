"""The client against the real app, through httpx.ASGITransport (no server, no sockets).

httpx's ASGITransport is async-only and the client is synchronous, so `SyncASGITransport`
runs each request on an event loop in a portal thread: the request still goes through
httpx's ASGI transport into the app, and the client under test is the one users get.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import anyio.from_thread
import httpx
import pytest
import yaml
from anyio.from_thread import BlockingPortal

from dlaas import Client
from service.api.app import create_app
from service.domain.catalog import DEFAULT_CATALOG
from service.platform import Platform
from service.settings import Settings
from tests.conftest import ADMIN_KEY


class SyncASGITransport(httpx.BaseTransport):
    """httpx.ASGITransport for a synchronous httpx.Client."""

    def __init__(self, app: Any) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._portal_cm: AbstractContextManager[BlockingPortal] = (
            anyio.from_thread.start_blocking_portal()
        )
        self._portal = self._portal_cm.__enter__()
        # The app's lifespan (migrations, the in-process scoring service), as a server runs it.
        self._lifespan = self._portal.wrap_async_context_manager(app.router.lifespan_context(app))
        self._lifespan.__enter__()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()

        async def call() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
            forwarded = httpx.Request(
                request.method, request.url, headers=request.headers, content=body
            )
            response = await self._asgi.handle_async_request(forwarded)
            content = await response.aread()
            return response.status_code, response.headers.raw, content

        status, headers, content = self._portal.call(call)
        return httpx.Response(status, headers=headers, content=content, request=request)

    def close(self) -> None:
        """Clients close their transport; this one is shared, so `shutdown` ends it."""

    def shutdown(self) -> None:
        try:
            self._lifespan.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    # The client sees the API, not the database: SQLite is enough here (the API tests
    # cover PostgreSQL).
    return f"sqlite:///{tmp_path / 'dlaas.db'}"


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    """The shared test settings, with a `tiny` plan of 2 predictions a minute."""
    plans = DEFAULT_CATALOG.model_dump(mode="json")["plans"]
    plans["tiny"] = {
        "distributed": False,
        "max_nodes": 1,
        "max_concurrent_trainings": 1,
        "predictions_per_minute": 2,
    }
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"plans": plans}))
    return Settings(
        home=tmp_path / "home",
        database_url=database_url,
        admin_api_key=ADMIN_KEY,
        max_upload_bytes=2 * 1024 * 1024,
        archive_max_files=50,
        archive_max_unpacked_bytes=1024 * 1024,
        catalog_file=catalog,
        scoring_poll_interval=0.2,
    )


@pytest.fixture
def transport(platform: Platform) -> Iterator[SyncASGITransport]:
    t = SyncASGITransport(create_app(platform=platform))
    yield t
    t.shutdown()


ClientFactory = Callable[..., Client]


@pytest.fixture
def make_client(
    transport: SyncASGITransport, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[ClientFactory]:
    """Clients of the app: `make_client(api_key)`; no environment or config leaks in."""
    for name in ("DLAAS_URL", "DLAAS_API_KEY", "DLAAS_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DLAAS_HOME", str(tmp_path / "client-home"))
    made: list[Client] = []

    def make(api_key: str | None = None, **kwargs: Any) -> Client:
        client = Client("http://dlaas.test", api_key, transport=transport, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def admin(make_client: ClientFactory) -> Client:
    return make_client(ADMIN_KEY)


@pytest.fixture
def me(admin: Client, make_client: ClientFactory) -> Client:
    """A client as tenant `acme` on the standard plan."""
    tenant = admin.tenants.create("acme", "standard")
    assert tenant.api_key
    return make_client(tenant.api_key)
