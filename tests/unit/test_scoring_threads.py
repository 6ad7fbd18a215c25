"""How many model calls run at once per deployment (DLAAS_SCORING_THREADS): one with
batching, whose call takes every request queued behind the one before; two without; what
the setting says where it is set. The scoring service gives that number to its batchers
and to each model process's connections."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from service.scoring.service import ScoringService
from service.settings import Settings


@pytest.mark.parametrize(
    ("environment", "threads"),
    [
        ({}, 1),
        ({"DLAAS_SCORING_BATCHING": "false"}, 2),
        ({"DLAAS_SCORING_THREADS": "3"}, 3),
        ({"DLAAS_SCORING_THREADS": "3", "DLAAS_SCORING_BATCHING": "false"}, 3),
    ],
)
def test_calls_at_once_per_deployment(
    environment: dict[str, str], threads: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DLAAS_SCORING_THREADS", "DLAAS_SCORING_BATCHING"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings(home_dir=tmp_path)
    assert settings.resolved_scoring_threads == threads
    scoring = ScoringService(SimpleNamespace(settings=settings, store=None))  # type: ignore[arg-type]
    assert scoring.cache.batching.threads == threads
    assert scoring.cache.process.connections == threads


def test_the_setting_takes_no_zero(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scoring_threads"):
        Settings(home_dir=tmp_path, scoring_threads=0)
