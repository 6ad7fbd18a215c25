"""Request rates: how many requests each tenant, and each address that sends bad keys, may
make, counted before a request's body is read (service.http.limits) or a gRPC message is
parsed (service.scoring.grpc_api).

A tenant's requests draw on one token bucket per tenant (its plan's `requests_per_second`
and `request_burst`), whichever of its keys, API process or protocol they come by; the
admin key is the operator's and is not counted. A request whose key is missing or not
valid draws on its client address's budget (DLAAS_AUTH_FAILURES_PER_MINUTE, a bucket that
refills at that many a minute): once it is spent, that address's requests without a key
this process already knows are refused before the key is looked up, so guessing keys, or
flooding with bad ones, costs the platform no database work and no other caller's turn.

Where the platform has Redis (DLAAS_SCORING_RATE_LIMIT_URL, default the broker when it is
Redis) the buckets live there and every API and scoring process shares them: one Lua
script reads, refills and takes atomically on Redis's clock. Otherwise (the embedded
platform: one process serves the API, the dashboard and scoring) they live in the process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from service.auth import TenantRef
from service.domain.buckets import Bucket, Take, idle_seconds, take
from service.domain.catalog import PlanSpec
from service.errors import FieldError, TooManyRequests

log = logging.getLogger("dlaas.api")

FAILURE_WINDOW_SECONDS = 60
PREFIX = "dlaas:requests"
# The most refusals a process holds back at once (RequestRates).
MAX_PAUSED = 1024


class BucketStore(Protocol):
    async def take(self, key: str, *, rate: float, burst: float, cost: float, need: float) -> Take:
        """Take `cost` tokens from the bucket `key` if it holds `need` (buckets.take)."""
        ...


class LocalBuckets:
    """The buckets of one process. Buckets idle long enough to be full again are dropped
    once there are more than `max_buckets`, so many addresses cost bounded memory."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_buckets: int = 10_000
    ) -> None:
        self._clock = clock
        self._max = max_buckets
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[Bucket, float]] = {}

    async def take(self, key: str, *, rate: float, burst: float, cost: float, need: float) -> Take:
        now = self._clock()
        with self._lock:
            held = self._buckets.get(key)
            answer, bucket = take(
                held[0] if held else None, now, rate=rate, burst=burst, cost=cost, need=need
            )
            if answer.allowed:
                self._buckets[key] = (bucket, now + idle_seconds(rate, burst))
                if len(self._buckets) > self._max:
                    self._prune(now)
            return answer

    def _prune(self, now: float) -> None:
        for name in [k for k, (_, full_at) in self._buckets.items() if full_at <= now]:
            del self._buckets[name]


# buckets.take as one atomic Redis script, on Redis's clock (TIME) so that every process
# agrees. KEYS[1]: the bucket; ARGV: rate, burst, cost, need, seconds until it is full.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens = burst
if held[1] then
  local elapsed = math.max(0, now - tonumber(held[2]))
  tokens = math.min(burst, tonumber(held[1]) + elapsed * rate)
end
if tokens >= need then
  local left = math.max(0, tokens - cost)
  redis.call('HSET', KEYS[1], 'tokens', tostring(left), 'updated', tostring(now))
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
  return {1, math.floor(left), 0}
end
return {0, math.floor(tokens), math.max(1, math.ceil((need - tokens) / rate))}
"""


class RedisBuckets:
    """The buckets in Redis, shared by every process that uses the same server.

    Redis is a shared limit, not a dependency of every request: while it cannot be reached
    (restarting, down, slower than `timeout`) each process counts in its own buckets (the
    limits hold per process meanwhile), says so once per outage, and goes back to Redis as
    soon as it answers again. A request never fails because the counter is away."""

    def __init__(self, url: str, *, timeout: float = 1.0) -> None:
        import redis.asyncio
        import redis.exceptions

        self._redis: Any = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._script = self._redis.register_script(_TAKE)
        self._unreachable: tuple[type[BaseException], ...] = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            OSError,
        )
        self._fallback = LocalBuckets()
        self._outage = False

    async def take(self, key: str, *, rate: float, burst: float, cost: float, need: float) -> Take:
        try:
            allowed, remaining, wait = await self._script(
                keys=[key], args=[rate, burst, cost, need, idle_seconds(rate, burst) + 1]
            )
        except self._unreachable as e:
            if not self._outage:
                self._outage = True
                log.warning("request rates counted in this process: Redis is unreachable (%s)", e)
            return await self._fallback.take(key, rate=rate, burst=burst, cost=cost, need=need)
        if self._outage:
            self._outage = False
            log.warning("request rates counted in Redis again")
        return Take(bool(allowed), int(remaining), int(wait))

    async def close(self) -> None:
        await self._redis.aclose()


def open_buckets(redis_url: str | None) -> BucketStore:
    return RedisBuckets(redis_url) if redis_url else LocalBuckets()


class RequestRates:
    """The two limits of the module's docstring over one bucket store.

    A refusal (429) is answered after `pause` seconds: a flood whose connections wait
    for each answer before sending the next (most clients, and every keep-alive one) then
    sends at most one request per connection per `pause`, instead of making the server
    spend, answering refusals, the time it owes other tenants. A paused refusal holds no
    thread, only its connection; at most `max_paused` wait at once in a process, and the
    others are answered at once.
    """

    def __init__(
        self,
        store: BucketStore,
        failures_per_minute: int,
        *,
        pause: float = 0.0,
        max_paused: int = MAX_PAUSED,
    ) -> None:
        self.store = store
        self.failures_per_minute = failures_per_minute
        self.pause = pause
        self.max_paused = max_paused
        self.paused = 0

    async def _refuse(self, error: TooManyRequests) -> NoReturn:
        if self.pause > 0 and self.paused < self.max_paused:
            self.paused += 1
            try:
                await asyncio.sleep(self.pause)
            finally:
                self.paused -= 1
        raise error

    async def tenant_request(self, tenant: TenantRef, plan: PlanSpec) -> None:
        """Count one request of the tenant; TooManyRequests when its plan's rate is spent."""
        answer = await self.store.take(
            f"{PREFIX}:tenant:{tenant.id}",
            rate=plan.requests_per_second,
            burst=plan.request_burst,
            cost=1,
            need=1,
        )
        if not answer.allowed:
            await self._refuse(
                TooManyRequests(
                    f"the {tenant.plan} plan allows {plan.requests_per_second:g} requests a "
                    f"second (requests_per_second, with bursts of {plan.request_burst}); "
                    f"retry in {answer.retry_after} s",
                    retry_after=answer.retry_after,
                    errors=[FieldError("requests_per_second", "the plan's request rate is spent")],
                )
            )

    def _failures(self, address: str) -> dict[str, Any]:
        return {
            "key": f"{PREFIX}:auth-failures:{address}",
            "rate": self.failures_per_minute / FAILURE_WINDOW_SECONDS,
            "burst": self.failures_per_minute,
            "need": 1,
        }

    def _spent(self, answer: Take) -> TooManyRequests:
        return TooManyRequests(
            f"too many requests with a missing or wrong API key from this address: at most "
            f"{self.failures_per_minute} a minute (DLAAS_AUTH_FAILURES_PER_MINUTE); "
            f"retry in {answer.retry_after} s",
            retry_after=answer.retry_after,
            errors=[FieldError("DLAAS_AUTH_FAILURES_PER_MINUTE", "this address's budget is spent")],
        )

    async def check_failures(self, address: str) -> None:
        """TooManyRequests once `address` has spent its budget of bad keys (takes none)."""
        answer = await self.store.take(**self._failures(address), cost=0)
        if not answer.allowed:
            await self._refuse(self._spent(answer))

    async def failed(self, address: str) -> None:
        """Count one request with a missing or wrong key from `address`; TooManyRequests
        when its budget was already spent."""
        answer = await self.store.take(**self._failures(address), cost=1)
        if not answer.allowed:
            await self._refuse(self._spent(answer))
