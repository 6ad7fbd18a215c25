"""A small cache whose entries expire: what the request paths remember so the steady
stream of requests does not ask the database about every one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values remembered for `ttl` seconds; at `size` entries it starts over (it holds
    hot keys, which come back at once). Reads take no lock: a dict read is atomic."""

    def __init__(self, ttl: float, size: int = 10_000) -> None:
        self.ttl = ttl
        self.size = size
        self._entries: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()
        self._generation = 0

    @property
    def generation(self) -> int:
        """Changes at every `clear`: read it before fetching a value to `put`."""
        return self._generation

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key: K, value: V, generation: int | None = None) -> None:
        """Remember `value`; with `generation` (as read before the value was fetched), not
        if the cache was cleared since: the value may predate what cleared it."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            if len(self._entries) >= self.size:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + self.ttl, value)

    def forget(self, where: Callable[[K], bool]) -> None:
        """Drop every entry whose key `where` accepts."""
        with self._lock:
            for key in [k for k in self._entries if where(k)]:
                del self._entries[key]

    def clear(self) -> None:
        """Drop every entry, and refuse the `put`s of values fetched before."""
        with self._lock:
            self._entries.clear()
            self._generation += 1
