"""Fixtures some API test modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.settings import Settings
from tests.conftest import ADMIN_KEY
from tests.s3_server import ACCESS_KEY, SECRET_KEY, moto_server


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def settings_on_each_store(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str
) -> Iterator[Settings]:
    """The platform's settings with its store local, then on a real S3 endpoint (moto). A
    module uses it by returning it from its own `settings` fixture."""
    common = {
        "home": tmp_path / "home",
        "runtimes_dir": tmp_path / "runtimes",
        "database_url": database_url,
        "admin_api_key": ADMIN_KEY,
    }
    if request.param == "local":
        yield Settings(**common)
        return
    with moto_server() as s3:
        yield Settings(
            **common,
            s3_endpoint=s3.url,
            s3_access_key=ACCESS_KEY,
            s3_secret_key=SECRET_KEY,
            s3_bucket="platform",
        )
