"""Connection pools: sized from the threads that use them, and lease renewals
on an engine of their own, so a renewal never waits behind step threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from harness import api, compose
from harness.api import STEP_CONNECTIONS
from harness.errors import ConfigError
from harness.settings import Settings
from harness.store import Checkpoint, RunPatch
from harness.store.sql import DEFAULT_POOL, HEARTBEAT_POOL, SQLStore, make_engine, pool_limits
from tests.rig import insert_run

THREADS = 6
WAIT = 30.0  # seconds; only reached when something is broken


def renewal(run_id: str, version: int) -> Checkpoint:
    now = time.time()
    return Checkpoint(
        run_id, version, "w1", now, run=RunPatch(owner="w1", lease_expires_at=now + 15)
    )


@contextmanager
def holding(store: SQLStore, count: int) -> Iterator[None]:
    """``count`` threads each hold one of the store's connections for the block."""
    held = threading.Barrier(count + 1, timeout=WAIT)
    release = threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with store.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1").scalar()
                held.wait()
                release.wait(WAIT)
        except BaseException as err:
            errors.append(err)
            held.abort()

    threads = [threading.Thread(target=hold) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        held.wait()
        yield
    finally:
        release.set()
        for t in threads:
            t.join(WAIT)
    assert errors == []


@pytest.fixture
def sized(database_url: str) -> Iterator[SQLStore]:
    store = SQLStore.from_url(database_url, pool_size=THREADS)
    yield store
    store.close()


def test_a_pool_sized_for_n_threads_keeps_n_connections(sized: SQLStore) -> None:
    pool = sized.engine.pool
    with holding(sized, THREADS):
        assert pool.checkedout() == THREADS
        assert pool.overflow() == 0  # all kept connections, none opened beyond the size


def test_renewal_gets_a_connection_while_step_threads_hold_the_pool(sized: SQLStore) -> None:
    insert_run(sized, "r1")
    heartbeat = sized.heartbeat_store()
    with holding(sized, THREADS):
        assert heartbeat.checkpoint(renewal("r1", 0)) == 1
        assert sized.engine.pool.checkedout() == THREADS  # still held: no waiting behind them
    assert sized.load("r1").version == 1


def test_renewal_gets_a_connection_while_the_pool_is_exhausted(sized: SQLStore) -> None:
    insert_run(sized, "r1")
    heartbeat = sized.heartbeat_store()
    kept, overflow = pool_limits(THREADS)
    with holding(sized, kept + overflow):
        assert sized.engine.pool.checkedout() == kept + overflow  # the next checkout waits
        assert heartbeat.checkpoint(renewal("r1", 0)) == 1


def test_the_heartbeat_store_is_made_once_on_an_engine_of_its_own(sized: SQLStore) -> None:
    heartbeat = sized.heartbeat_store()
    assert sized.heartbeat_store() is heartbeat
    assert heartbeat.heartbeat_store() is heartbeat
    assert heartbeat.engine is not sized.engine
    assert heartbeat.engine.url == sized.engine.url
    assert heartbeat._sql_cache is sized._sql_cache  # statements compiled once for both
    assert heartbeat.engine.pool.size() == HEARTBEAT_POOL[0]  # type: ignore[attr-defined]


def test_close_and_forget_connections_reach_the_heartbeat_engine(sized: SQLStore) -> None:
    heartbeat = sized.heartbeat_store()
    opened: list[Any] = []  # forgotten connections are closed here, as a forked child would
    for engine in (sized.engine, heartbeat.engine):
        event.listen(engine, "connect", lambda dbapi, _record: opened.append(dbapi))
    insert_run(sized, "r1")
    heartbeat.checkpoint(renewal("r1", 0))
    before = heartbeat.engine.pool
    assert before.checkedin() == 1
    sized.forget_connections()
    for dbapi in opened:
        dbapi.close()
    assert heartbeat.engine.pool is not before
    heartbeat.checkpoint(renewal("r1", 1))
    after = heartbeat.engine.pool
    sized.close()
    assert heartbeat.engine.pool is not after
    assert heartbeat.engine.pool.checkedin() == 0


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
