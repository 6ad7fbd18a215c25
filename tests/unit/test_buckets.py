"""Token buckets (service.domain.buckets) and the request rates over them
(service.http.rates): a table of takes, then the process's store and the two limits."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.auth import TenantRef
from service.domain.buckets import Bucket, Take, idle_seconds, take
from service.domain.catalog import DEFAULT_CATALOG
from service.errors import TooManyRequests
from service.http.rates import LocalBuckets, RequestRates


@pytest.mark.parametrize(
    ("bucket", "now", "rate", "burst", "cost", "need", "answer", "after"),
    [
        # A new bucket is full.
        (None, 0.0, 2.0, 5.0, 1.0, 1.0, Take(True, 4, 0), Bucket(4.0, 0.0)),
        # The last token goes; none is left.
        (Bucket(1.0, 0.0), 0.0, 2.0, 5.0, 1.0, 1.0, Take(True, 0, 0), Bucket(0.0, 0.0)),
        # Empty: refused, with the whole seconds until a token is there.
        (Bucket(0.0, 0.0), 0.0, 2.0, 5.0, 1.0, 1.0, Take(False, 0, 1), Bucket(0.0, 0.0)),
        (Bucket(0.0, 0.0), 0.0, 0.1, 5.0, 1.0, 1.0, Take(False, 0, 10), Bucket(0.0, 0.0)),
        (Bucket(0.5, 0.0), 0.0, 0.1, 5.0, 1.0, 1.0, Take(False, 0, 5), Bucket(0.5, 0.0)),
        # Time refills it at `rate`...
        (Bucket(0.0, 0.0), 0.5, 2.0, 5.0, 1.0, 1.0, Take(True, 0, 0), Bucket(0.0, 0.5)),
        (Bucket(0.0, 10.0), 11.0, 2.0, 5.0, 1.0, 1.0, Take(True, 1, 0), Bucket(1.0, 11.0)),
        # ...up to `burst`, never more.
        (Bucket(0.0, 0.0), 100.0, 2.0, 5.0, 1.0, 1.0, Take(True, 4, 0), Bucket(4.0, 100.0)),
        # A clock that runs backwards adds nothing.
        (Bucket(1.0, 10.0), 5.0, 2.0, 5.0, 1.0, 1.0, Take(True, 0, 0), Bucket(0.0, 5.0)),
        # A look (cost 0) takes nothing.
        (Bucket(3.0, 0.0), 0.0, 2.0, 5.0, 0.0, 1.0, Take(True, 3, 0), Bucket(3.0, 0.0)),
        (Bucket(0.2, 0.0), 0.0, 1.0, 5.0, 0.0, 1.0, Take(False, 0, 1), Bucket(0.2, 0.0)),
        # A take that needs nothing always succeeds and never goes below zero.
        (Bucket(0.0, 0.0), 0.0, 1.0, 5.0, 1.0, 0.0, Take(True, 0, 0), Bucket(0.0, 0.0)),
        # Fractional rates (a budget a minute).
        (Bucket(0.0, 0.0), 30.0, 2 / 60, 2.0, 1.0, 1.0, Take(True, 0, 0), Bucket(0.0, 30.0)),
        (Bucket(0.0, 0.0), 29.0, 2 / 60, 2.0, 1.0, 1.0, Take(False, 0, 1), None),
    ],
)
def test_take(
    bucket: Bucket | None,
    now: float,
    rate: float,
    burst: float,
    cost: float,
    need: float,
    answer: Take,
    after: Bucket | None,
) -> None:
    got, left = take(bucket, now, rate=rate, burst=burst, cost=cost, need=need)
    assert got == answer
    if after is not None:
        assert left.updated == after.updated
        assert left.tokens == pytest.approx(after.tokens)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 5.0)])
def test_a_bucket_needs_a_positive_rate_and_burst(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="positive rate and burst"):
        take(None, 0.0, rate=rate, burst=burst)


@pytest.mark.parametrize(("rate", "burst", "seconds"), [(1, 10, 10), (1000, 2000, 2), (2, 1, 1)])
def test_idle_seconds(rate: float, burst: float, seconds: int) -> None:
    assert idle_seconds(rate, burst) == seconds


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_local_buckets_count_each_key_apart_and_refill() -> None:
    clock = Clock()
    store = LocalBuckets(clock)

    async def takes(key: str, n: int) -> list[bool]:
        return [(await store.take(key, rate=1, burst=3, cost=1, need=1)).allowed for _ in range(n)]

    assert asyncio.run(takes("a", 4)) == [True, True, True, False]
    assert asyncio.run(takes("b", 1)) == [True]  # another key has its own bucket
    clock.now += 2
    assert asyncio.run(takes("a", 3)) == [True, True, False]


def test_local_buckets_forget_full_buckets_past_their_bound() -> None:
    clock = Clock()
    store = LocalBuckets(clock, max_buckets=3)

    async def take_each(keys: list[str]) -> None:
        for key in keys:
            await store.take(key, rate=1, burst=2, cost=1, need=1)

    asyncio.run(take_each(["a", "b", "c"]))
    clock.now += 10  # all three are full again
    asyncio.run(take_each(["d"]))
    assert set(store._buckets) == {"d"}


STANDARD = DEFAULT_CATALOG.plans["standard"].model_copy(
    update={"requests_per_second": 1, "request_burst": 2}
)


def test_a_tenant_over_its_rate_is_refused_naming_the_limit() -> None:
    rates = RequestRates(LocalBuckets(Clock()), failures_per_minute=10)
    acme = TenantRef("t-acme", "acme", "standard")
    other = TenantRef("t-other", "other", "standard")

    async def run() -> TooManyRequests:
        await rates.tenant_request(acme, STANDARD)
        await rates.tenant_request(acme, STANDARD)
        await rates.tenant_request(other, STANDARD)  # its own bucket
        with pytest.raises(TooManyRequests) as refused:
            await rates.tenant_request(acme, STANDARD)
        return refused.value

    error = asyncio.run(run())
    assert error.headers["Retry-After"] == "1"
    assert error.errors[0].field == "requests_per_second"
    assert "standard plan allows 1 requests a second" in error.detail


def test_an_address_has_a_budget_of_bad_keys_a_minute() -> None:
    clock = Clock()
    rates = RequestRates(LocalBuckets(clock), failures_per_minute=3)

    async def run() -> list[str]:
        seen = []
        for _ in range(5):
            try:
                await rates.check_failures("10.0.0.1")
                await rates.failed("10.0.0.1")
                seen.append("counted")
            except TooManyRequests as e:
                seen.append(e.headers["Retry-After"])
        await rates.check_failures("10.0.0.2")  # another address is untouched
        return seen

    assert asyncio.run(run()) == ["counted", "counted", "counted", "20", "20"]
    clock.now += 20  # one failure a 20 s back
    asyncio.run(rates.check_failures("10.0.0.1"))


def test_refusals_wait_the_pause_but_no_more_than_max_paused_at_once() -> None:
    rates = RequestRates(LocalBuckets(Clock()), failures_per_minute=1, pause=0.3, max_paused=2)

    async def refused() -> float:
        started = time.monotonic()
        with pytest.raises(TooManyRequests):
            await rates.check_failures("10.0.0.1")
        return time.monotonic() - started

    async def run() -> list[float]:
        await rates.failed("10.0.0.1")
        return list(await asyncio.gather(*(refused() for _ in range(3))))

    waits = sorted(asyncio.run(run()))
    assert waits[0] < 0.1  # the third found two waiting and was answered at once
    assert waits[1] >= 0.3 and waits[2] >= 0.3
    assert rates.paused == 0
