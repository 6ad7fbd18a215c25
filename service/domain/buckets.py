"""Token buckets: how many requests a caller may make now, and when it may make the next.

A bucket holds at most `burst` tokens and gains `rate` tokens a second; a request takes
`cost` tokens if the bucket holds at least `need` (a look that takes nothing has cost 0).
The same arithmetic runs in the API process (one process) and, as a Lua script, in Redis
(every process of a cluster), so both answer the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """A bucket's tokens as of `updated` (seconds, any monotonic clock)."""

    tokens: float
    updated: float


@dataclass(frozen=True)
class Take:
    """The answer to a request: allowed or not, the tokens left, and the whole seconds
    until it would be allowed (0 when it is)."""

    allowed: bool
    remaining: int
    retry_after: int


def refilled(bucket: Bucket | None, now: float, rate: float, burst: float) -> float:
    """The bucket's tokens at `now`: a new bucket is full; time never runs backwards."""
    if bucket is None:
        return burst
    elapsed = max(0.0, now - bucket.updated)
    return min(burst, bucket.tokens + elapsed * rate)


def take(
    bucket: Bucket | None,
    now: float,
    *,
    rate: float,
    burst: float,
    cost: float = 1.0,
    need: float = 1.0,
) -> tuple[Take, Bucket]:
    """Take `cost` tokens if at least `need` are there; the answer and the bucket after."""
    if rate <= 0 or burst <= 0:
        raise ValueError("a bucket needs a positive rate and burst")
    tokens = refilled(bucket, now, rate, burst)
    if tokens >= need:
        left = max(0.0, tokens - cost)
        return Take(True, math.floor(left), 0), Bucket(left, now)
    wait = max(1, math.ceil((need - tokens) / rate))
    return Take(False, math.floor(tokens), wait), Bucket(tokens, now)


def idle_seconds(rate: float, burst: float) -> int:
    """How long an untouched bucket takes to fill again: after that it may be forgotten
    (a forgotten bucket is a full one)."""
    return max(1, math.ceil(burst / rate))
