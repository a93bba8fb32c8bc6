"""A worker's catalog refresher on its stop: no publish after the withdrawal
(a dead worker's agents would look live for a minute and a half)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.agents  # noqa: F401  (registers the test agents)
from harness.celery.publishing import Refresher
from harness.settings import Settings


def test_a_publish_after_the_stop_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path
) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    refresher = Refresher("w1@host", Settings.from_env(), interval=3600)
    refresher.start()
    store = refresher._store
    assert store is not None
    assert {a.worker for a in store.published_agents(0.0)} == {"w1@host"}
    refresher.stop()
    refresher._publish()  # a refresh tick that lost the race with the stop
    reader = type(store).from_url(sqlite_url)
    assert reader.published_agents(0.0) == []
    reader.close()
