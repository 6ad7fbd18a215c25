"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.logs import LogStore
from service.logs.files import FileLogStore
from service.logs.redis import RedisLogStore

# A Redis database of its own for the log store tests (the shared Redis is not flushed).
LOG_REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.integration)])
def log_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStore]:
    """Each log store the platform has: files under tmp_path, and Redis (integration)."""
    if request.param == "file":
        yield FileLogStore(tmp_path / "logs")
        return
    redis_store = RedisLogStore(LOG_REDIS_URL)
    yield redis_store
    redis_store.close()
