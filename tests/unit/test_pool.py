"""Connection pools: sized from the threads that use them. Pools holding real
connections, on each SQL backend, are tests/contract/test_pools.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import api, compose
from harness.api import STEP_CONNECTIONS
from harness.errors import ConfigError
from harness.settings import Settings
from harness.store.sql import DEFAULT_POOL, SQLStore, make_engine, pool_limits


def test_in_memory_sqlite_is_its_own_heartbeat_store() -> None:
    store = SQLStore(make_engine("sqlite://"))
    assert store.heartbeat_store() is store
    store.close()


def test_pool_limits() -> None:
    assert pool_limits(None) == DEFAULT_POOL
    assert pool_limits(1) == (1, 2)
    assert pool_limits(16) == (16, 4)
    with pytest.raises(ConfigError, match="pool size must be positive"):
        pool_limits(0)


@pytest.mark.parametrize("url", ["postgresql://u@db/h", "sqlite:///pool.db"])
def test_make_engine_sizes_the_pool(url: str) -> None:
    sized = make_engine(url, pool_size=12)
    assert (sized.pool.size(), sized.pool._max_overflow) == (12, 3)  # type: ignore[attr-defined]
    strict = make_engine(url, pool_size=3, max_overflow=0)
    assert (strict.pool.size(), strict.pool._max_overflow) == (3, 0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("threads", "explicit", "kept"),
    [(12, None, 12), (500, None, STEP_CONNECTIONS), (500, 40, 40)],
)
def test_a_threads_pool_keeps_a_bounded_number_of_connections(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    threads: int,
    explicit: int | None,
    kept: int,
) -> None:
    """One connection per step thread up to STEP_CONNECTIONS, however many threads;
    HARNESS_DB_POOL_SIZE is taken as it is."""
    monkeypatch.setattr(compose, "_step_threads", threads)
    env = {"HARNESS_DATABASE_URL": f"sqlite:///{tmp_path / 'h.db'}"}
    if explicit is not None:
        env["HARNESS_DB_POOL_SIZE"] = str(explicit)
    store = api.open_store(Settings.from_env(env))
    try:
        assert store.engine.pool.size() == kept  # type: ignore[attr-defined]
    finally:
        store.close()
