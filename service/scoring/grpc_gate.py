"""What a call to the scoring gRPC port passes before its message is read: the caller's key
from the call's metadata (`authorization: Bearer <key>`) and its request rate, the same
check as the REST API's (service.http.limits.CallerCheck).

gRPC's server reads a unary call's whole message and hands it to the method's handler;
a handler that checks the key itself has already received and parsed whatever an unknown
caller sent (up to DLAAS_MAX_PREDICTION_BYTES, the server's receive cap). Here every
unary method is served as a client-streaming one whose messages are received only when
asked for: the key and the rate are checked first, and a refused call ends with
UNAUTHENTICATED, PERMISSION_DENIED or RESOURCE_EXHAUSTED (a `retry-after` in its trailing
metadata) before a byte of its message is read; an accepted call receives its one message
and goes on to the method's own handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from service.errors import BadRequest
from service.http.auth import key_of_header
from service.http.limits import CallerCheck

Refuse = Callable[[aio.ServicerContext, BaseException], Awaitable[None]]


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = rest.rpartition(":")[0]
        return host.strip("[]") or peer
    return peer


def metadata_key(metadata: Any) -> str:
    """The API key of a call's `authorization` metadata (Unauthorized without one)."""
    for key, value in metadata or ():
        if key == "authorization":
            return key_of_header(value if isinstance(value, str) else value.decode())
    return key_of_header("")


SENT_NO_MESSAGE = "the call sent no message"


async def check_caller(callers: CallerCheck, context: Any, refuse: Refuse) -> None:
    """The call's key (its `authorization` metadata) and its rate, against the caller's
    address; a refused call is ended with its status (`refuse`) and the refusal raised.
    Both transports of the port check their calls with this (`CallerGate` for grpcio,
    `grpc_front` for the native front)."""
    metadata = context.invocation_metadata()
    try:
        await callers.check(lambda: metadata_key(metadata), peer_host(context.peer()))
    except BaseException as e:
        await refuse(context, e)
        raise


async def _unchecked(request: Any, context: aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a streaming method is not served")


class CallerGate(aio.ServerInterceptor):  # type: ignore[misc]
    """The server interceptor of the module's docstring."""

    def __init__(self, callers: CallerCheck, refuse: Refuse) -> None:
        self.callers = callers
        self.refuse = refuse

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.request_streaming or handler.response_streaming:
            # Every method of the service is unary; a streaming one would pass unchecked,
            # so it is refused until this gate learns to check it.
            return grpc.unary_unary_rpc_method_handler(_unchecked)
        unary = handler.unary_unary
        callers = self.callers
        refuse = self.refuse

        async def checked(requests: AsyncIterator[Any], context: aio.ServicerContext) -> Any:
            await check_caller(callers, context, refuse)
            async for message in requests:  # the one message of a unary call
                return await unary(message, context)
            await refuse(context, BadRequest(SENT_NO_MESSAGE))
            return None

        return grpc.stream_unary_rpc_method_handler(
            checked,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
