"""The platform's HTTP protocol (service.http.protocol) under a real uvicorn server on
uvloop, as every entry point configures it (`server_config`): answers whole and in order
on a kept-alive connection, a large body and a long stream intact, and the head of a
response whose body comes later is not held back until its body."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from service.http.protocol import HttpProtocol
from service.http.server import server_config
from tests.s3_server import free_port

BIG = bytes(range(256)) * 16 * 1024  # 4 MiB
LATE = 1.0  # seconds before /late sends its body


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(2000):
            await send({"type": "http.response.body", "body": b"%05d\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = {"/big": BIG}.get(path, path.encode())
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if path == "/late":
        await asyncio.sleep(LATE)
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    config = server_config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_every_entry_point_serves_with_the_platforms_protocol() -> None:
    config = server_config(app, host="127.0.0.1", port=1)
    config.load()
    assert config.http_protocol_class is HttpProtocol


def test_answers_on_a_kept_alive_connection_are_whole_and_in_order(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        for i in range(200):
            r = client.get(f"/answer-{i}")
            assert (r.status_code, r.content) == (200, f"/answer-{i}".encode())
        r = client.get("/big")
        assert r.content == BIG
        r = client.get("/stream")
        assert r.content == b"".join(b"%05d\n" % i for i in range(2000))
        assert client.get("/after").content == b"/after"


def test_a_head_is_not_held_until_its_late_body(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        started = time.monotonic()
        with client.stream("GET", "/late") as r:
            head_after = time.monotonic() - started
            assert r.status_code == 200
            assert r.read() == b"/late"
            body_after = time.monotonic() - started
    assert head_after < LATE / 2, head_after
    assert body_after >= LATE
