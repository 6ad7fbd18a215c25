"""Refuse request bodies above the configured size before anything is parsed or stored."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _TooLarge(HTTPException):
    """An HTTPException, so body parsers that wrap other errors as 400 let it through and
    the app's own problem handler renders it."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, _detail(max_bytes))


def _detail(max_bytes: int) -> str:
    return f"the request body is larger than the limit of {max_bytes} bytes"


class BodySizeLimit:
    """ASGI middleware: 413 problem+json when a body is (or turns out to be) too large.

    Content-Length is checked up front; chunked bodies are counted as they stream in.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        detail = _detail(self.max_bytes)
        body = json.dumps(
            {
                "type": "urn:dlaas:problem:payload-too-large",
                "title": "Payload too large",
                "status": 413,
                "detail": detail,
                "instance": scope.get("path", ""),
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
