"""The scoring gRPC port checks a call's key and request rate before it reads the call's
message (service.scoring.grpc_gate): an unauthenticated 31 MiB Predict is UNAUTHENTICATED
and never parsed, a tenant over its plan's rate gets RESOURCE_EXHAUSTED with retry-after,
bad keys spend the address's budget, and a message over the server's cap is refused
before it is parsed. Raw bytes on the wire: no TensorFlow needed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.platform import Platform
from service.scoring import front_protocol, grpc_api
from service.scoring.grpc_gate import peer_host
from service.settings import Settings
from tests.conftest import create_tenant

PREDICT = "/tensorflow.serving.PredictionService/Predict"
METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
MIB = 1024 * 1024
BURST = 3
BUDGET = 4


class Served:
    def __init__(self, client: TestClient, port: int) -> None:
        self.client = client
        self.port = port
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]
        )

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def call(self, method: str, body: bytes, key: str | None = None) -> grpc.RpcError:
        metadata = [("authorization", f"Bearer {key}")] if key is not None else []
        stub = self.channel.unary_unary(method)
        with pytest.raises(grpc.RpcError) as info:
            stub(body, metadata=metadata, timeout=60)
        error: grpc.RpcError = info.value
        return error


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the messages the servicer parsed."""
    sizes: list[int] = []
    parse = grpc_api._parse

    def counting(message: Any, body: bytes) -> Any:
        sizes.append(len(body))
        return parse(message, body)

    monkeypatch.setattr(grpc_api, "_parse", counting)
    return sizes


class FromTheFront:
    """What the native front handed to this process: the sizes of the messages, and for
    each call whether the front was reading its message before it was checked."""

    def __init__(self) -> None:
        self.messages: list[int] = []
        self.read_unchecked: list[bool] = []


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> FromTheFront:
    seen = FromTheFront()
    arrived = front_protocol.FrontProtocol._received

    def counting(self: front_protocol.FrontProtocol, kind: int, call: int, payload: bytes) -> None:
        if kind == front_protocol.MESSAGE:
            seen.messages.append(len(payload))
        if kind == front_protocol.CALL:
            flags = int.from_bytes(payload[:4], "little")
            seen.read_unchecked.append(bool(flags & front_protocol.READING))
        arrived(self, kind, call, payload)

    monkeypatch.setattr(front_protocol.FrontProtocol, "_received", counting)
    return seen


@pytest.fixture
def served(settings: Settings, grpc_front: str) -> Iterator[Served]:
    update = {
        "scoring_grpc_port": 0,
        "scoring_grpc_front": grpc_front,
        "auth_failures_per_minute": BUDGET,
        "rate_limit_pause_seconds": 0,
    }
    platform = Platform.from_settings(settings.model_copy(update=update))
    lite = platform.catalog.plans["lite"].model_copy(
        update={"requests_per_second": 1 / 60, "request_burst": BURST}
    )
    platform.catalog = platform.catalog.model_copy(
        update={"plans": {**platform.catalog.plans, "lite": lite}}
    )
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as client:
            served = Served(client, client.app.state.grpc_port)  # type: ignore[attr-defined]
            with served.channel:
                yield served
    finally:
        platform.close()


def trailing(error: grpc.RpcError) -> dict[str, str]:
    return dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]


def test_an_unauthenticated_31_mib_call_is_refused_unparsed(
    served: Served, parsed: list[int]
) -> None:
    body = b"\x00" * (31 * MIB)
    for key in (None, "not-a-key"):
        error = served.call(PREDICT, body, key)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
    assert parsed == []


@pytest.mark.parametrize("grpc_front", ["native"], indirect=True)
def test_the_native_front_reads_no_message_before_the_check(
    served: Served, received: FromTheFront, parsed: list[int]
) -> None:
    """The front holds a call's message unread until this process has checked the
    caller: a stranger's 31 MiB, or, on a connection of its own, a known tenant's over its
    rate, never leaves it."""
    body = b"\x00" * (31 * MIB)
    for key in (None, "not-a-key", "not-a-key"):
        error = served.call(PREDICT, body, key)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
    noisy = create_tenant(served.client, "noisy", "lite")["Authorization"].removeprefix("Bearer ")
    for _ in range(BURST):
        error = served.call(METADATA, b"\x0a\x05\x0a\x03abc", noisy)
        assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
    with Served(served.client, served.port) as fresh:
        error = fresh.call(PREDICT, body, noisy)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert received.messages == [7] * BURST
    assert parsed == [7] * BURST


@pytest.mark.parametrize("grpc_front", ["native"], indirect=True)
def test_the_native_front_reads_at_once_only_for_a_caller_that_passed_on_the_connection(
    served: Served, received: FromTheFront, parsed: list[int]
) -> None:
    """A connection's next call with the key its last call passed with is read before its
    check (one round trip fewer); still checked, and a refusal ends that."""
    noisy = create_tenant(served.client, "noisy", "lite")["Authorization"].removeprefix("Bearer ")
    other = create_tenant(served.client, "other", "standard")["Authorization"]
    for _ in range(BURST):
        error = served.call(METADATA, b"\x0a\x05\x0a\x03abc", noisy)
        assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
    assert received.read_unchecked == [False, True, True]
    # Over its rate: read at once, still refused, and the connection is forgotten.
    for _ in range(2):
        error = served.call(METADATA, b"\x0a\x05\x0a\x03abc", noisy)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert received.read_unchecked == [False, True, True, True, False]
    # Another key on the same connection is checked first.
    for _ in range(2):
        error = served.call(METADATA, b"\x0a\x05\x0a\x03abc", other.removeprefix("Bearer "))
        assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
    assert received.read_unchecked == [False, True, True, True, False, False, True]
    assert parsed == [7] * (BURST + 2)


def test_a_known_key_is_parsed_and_answered(served: Served, parsed: list[int]) -> None:
    tenant = create_tenant(served.client, "acme", "standard")
    key = tenant["Authorization"].removeprefix("Bearer ")
    error = served.call(METADATA, b"\x0a\x05\x0a\x03abc", key)  # model_spec.name = "abc"
    assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
    assert parsed == [7]


def test_a_message_over_the_cap_is_refused_unparsed(served: Served, parsed: list[int]) -> None:
    tenant = create_tenant(served.client, "acme", "standard")
    key = tenant["Authorization"].removeprefix("Bearer ")
    error = served.call(PREDICT, b"\x00" * (33 * MIB), key)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert parsed == []


def test_a_tenant_over_its_rate_is_resource_exhausted(served: Served, parsed: list[int]) -> None:
    noisy = create_tenant(served.client, "noisy", "lite")["Authorization"].removeprefix("Bearer ")
    quiet = create_tenant(served.client, "quiet", "standard")["Authorization"]
    for _ in range(BURST):
        error = served.call(METADATA, b"\x0a\x05\x0a\x03abc", noisy)
        assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
    error = served.call(PREDICT, b"\x00" * MIB, noisy)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "requests_per_second" in error.details()
    assert trailing(error)["retry-after"] == "60"
    assert parsed == [7] * BURST
    # The REST API shares the bucket; another tenant is served on both.
    r = served.client.get("/v1/trainings", headers={"Authorization": f"Bearer {noisy}"})
    assert r.status_code == 429
    assert served.client.get("/v1/trainings", headers={"Authorization": quiet}).status_code == 200
    error = served.call(METADATA, b"\x0a\x05\x0a\x03abc", quiet.removeprefix("Bearer "))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_bad_keys_spend_the_address_budget(served: Served, parsed: list[int]) -> None:
    for i in range(BUDGET):
        error = served.call(PREDICT, b"", f"guess-{i}")
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
    error = served.call(PREDICT, b"", "guess-x")
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "DLAAS_AUTH_FAILURES_PER_MINUTE" in error.details()
    assert trailing(error)["retry-after"] == "15"
    assert parsed == []


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:50051", "127.0.0.1"),
        ("ipv6:[::1]:50051", "::1"),
        ("ipv6:[2001:db8::7]:443", "2001:db8::7"),
        ("unix:/run/dlaas.sock", "unix:/run/dlaas.sock"),
    ],
)
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host
