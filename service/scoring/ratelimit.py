"""Per-tenant prediction rate limits: fixed one-minute windows, counted in instances.

Each scored instance is one prediction (a request with 64 instances uses 64). Counting
happens in the scoring process when it is alone (embedded), or in Redis when scoring
replicas share a limit (`DLAAS_SCORING_RATE_LIMIT_URL`, default the broker if it is Redis).
Refused requests do not use up the window.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

WINDOW_SECONDS = 60


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    # Seconds until the window that refused the request ends (0 when allowed).
    retry_after: int


class RateLimiter(Protocol):
    async def acquire(self, tenant_id: str, limit: int, amount: int) -> RateDecision:
        """Take `amount` predictions from the tenant's window of `limit`, if they fit."""
        ...

    async def close(self) -> None: ...


def _window(now: float) -> tuple[int, int]:
    """The current window's number and the whole seconds until it ends (at least 1)."""
    window = int(now // WINDOW_SECONDS)
    return window, max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))


class InProcessRateLimiter:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, int]] = {}

    async def acquire(self, tenant_id: str, limit: int, amount: int) -> RateDecision:
        window, left = _window(self._clock())
        with self._lock:
            seen_window, used = self._counts.get(tenant_id, (window, 0))
            if seen_window != window:
                used = 0
            if used + amount > limit:
                return RateDecision(False, limit, max(0, limit - used), left)
            self._counts[tenant_id] = (window, used + amount)
            return RateDecision(True, limit, limit - used - amount, 0)

    async def close(self) -> None:
        return None


class RedisRateLimiter:
    """INCRBY on a key per tenant and window that expires after the window."""

    def __init__(
        self, url: str, *, prefix: str = "dlaas:ratelimit", clock: Callable[[], float] = time.time
    ) -> None:
        import redis.asyncio

        self._redis = redis.asyncio.Redis.from_url(url)
        self._prefix = prefix
        self._clock = clock

    async def acquire(self, tenant_id: str, limit: int, amount: int) -> RateDecision:
        window, left = _window(self._clock())
        key = f"{self._prefix}:{tenant_id}:{window}"
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(key, amount)
            pipe.expire(key, WINDOW_SECONDS + 5, nx=True)
            used, _ = await pipe.execute()
        if used > limit:
            await self._redis.decrby(key, amount)
            return RateDecision(False, limit, max(0, limit - (used - amount)), left)
        return RateDecision(True, limit, limit - used, 0)

    async def close(self) -> None:
        await self._redis.aclose()


def make_rate_limiter(redis_url: str | None) -> RateLimiter:
    return RedisRateLimiter(redis_url) if redis_url else InProcessRateLimiter()
