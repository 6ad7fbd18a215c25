"""The request buckets in Redis (service.http.rates.RedisBuckets, one Lua script) answer as
the process's own do, and two API processes that share a Redis share each bucket."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

import pytest

from service.domain.buckets import Take
from service.http.rates import LocalBuckets, RedisBuckets

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("DLAAS_TEST_REDIS", "redis://127.0.0.1:6379/0")


def test_redis_buckets_answer_as_local_ones() -> None:
    key = f"dlaas:test:{uuid.uuid4().hex}"
    # A rate slow enough that the test's own time refills nothing visible.
    steps = [(1.0, 1.0)] * 4 + [(0.0, 1.0), (1.0, 0.0), (0.0, 1.0)]

    async def run(store: LocalBuckets | RedisBuckets) -> list[Take]:
        return [
            await store.take(key, rate=0.01, burst=3, cost=cost, need=need) for cost, need in steps
        ]

    async def in_redis() -> list[Take]:
        store = RedisBuckets(REDIS_URL)
        try:
            return await run(store)
        finally:
            await store.close()

    local = asyncio.run(run(LocalBuckets()))
    assert local == [
        Take(True, 2, 0),
        Take(True, 1, 0),
        Take(True, 0, 0),
        Take(False, 0, 100),
        Take(False, 0, 100),
        Take(True, 0, 0),
        Take(False, 0, 100),
    ]
    assert asyncio.run(in_redis()) == local


def test_two_processes_share_a_bucket_and_it_expires() -> None:
    key = f"dlaas:test:{uuid.uuid4().hex}"

    async def run() -> tuple[list[bool], int]:
        first, second = RedisBuckets(REDIS_URL), RedisBuckets(REDIS_URL)
        try:
            seen = []
            for store in (first, second, first, second):
                answer = await store.take(key, rate=0.5, burst=3, cost=1, need=1)
                seen.append(answer.allowed)
            ttl = await first._redis.ttl(key)
            return seen, int(ttl)
        finally:
            await first.close()
            await second.close()

    seen, ttl = asyncio.run(run())
    assert seen == [True, True, True, False]
    # Forgotten once it would be full again (burst / rate = 6 s, plus one).
    assert 0 < ttl <= 7


def test_while_redis_is_unreachable_each_process_counts_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request is never refused or failed because the shared counter is away: with no
    Redis at the address, the buckets are counted in the process (the limit still holds
    there), and the outage is said once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed

    async def flow() -> list[Take]:
        store = RedisBuckets(f"redis://127.0.0.1:{port}/15", timeout=0.5)
        try:
            return [await store.take("k", rate=0.001, burst=2, cost=1, need=1) for _ in range(3)]
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="dlaas.api"):
        answers = asyncio.run(flow())
    assert [a.allowed for a in answers] == [True, True, False]
    assert answers[2].retry_after > 0
    said = [r.getMessage() for r in caplog.records if "Redis is unreachable" in r.getMessage()]
    assert len(said) == 1
