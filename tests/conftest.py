"""Shared fixtures: a scrubbed environment, fresh stores, service URLs."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from harness import api
from harness.celery.config import make_sender
from harness.store import Store
from harness.store.memory import MemoryStore
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore, make_engine
from tests import services
from tests.cluster import Cluster, cluster
from tests.services import POSTGRES_ADMIN_URL, POSTGRES_TEST_DB, REDIS_CACHE_DB, REDIS_URL, require
from tests.wire import WireServer

REPO = Path(__file__).resolve().parents[1]
# Settings of the test run itself, not of the harness under test.
KEEP_VARS = ("HARNESS_REQUIRE_SERVICES", "HARNESS_TEST_")


@pytest.fixture(autouse=True)
def _scrub_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No test sees the developer's HARNESS_* settings; each runs in its own directory."""
    for name in list(os.environ):
        if name.startswith("HARNESS_") and not name.startswith(KEEP_VARS):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    # A test that imported `tasks` installed the app's sender for the process:
    # every test starts with the library's own (the CLI's).
    api.use_sender(make_sender)
    api.use_store(None)
    api.reset_runtime()
    yield
    api.reset_runtime()


@pytest.fixture(autouse=True)
def _no_current_event_loop_left() -> Iterator[None]:
    """Pydantic AI's ``run_sync`` makes a loop the thread's current one and
    never closes it: closed here, after the test that made it, rather than
    collected during a later one (whose ResourceWarning, an error in this
    suite, would then fail that test)."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:  # none is current
            return
    if not loop.is_running():
        loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'harness.db'}"


_pg_ready = False


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A migrated PostgreSQL database, emptied before each test."""
    global _pg_ready
    require("postgres")
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{POSTGRES_TEST_DB}"
    if not _pg_ready:
        admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": POSTGRES_TEST_DB}
            ).scalar()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{POSTGRES_TEST_DB}"'))
        admin.dispose()
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        _pg_ready = True
    store = SQLStore.from_url(url)
    store.reset()
    store.close()
    yield url


#: The store backends of the contract suite. A test that takes ``store`` runs
#: on each; one that takes ``database_url`` (it needs a URL: a settings
#: variable, a second engine, raw SQL) runs on the SQL ones only.
SQL_BACKENDS = ("sqlite", "postgresql")
BACKENDS = (*SQL_BACKENDS, "memory")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``backend`` (behind ``store`` and ``database_url``): every
    backend, but no in-memory store for a test that needs a database URL."""
    if "backend" in metafunc.fixturenames:
        sql = "database_url" in metafunc.fixturenames
        metafunc.parametrize("backend", SQL_BACKENDS if sql else BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The store backend under test: ``sqlite``, ``postgresql`` or ``memory``."""
    return str(request.param)


def _migrated_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'harness.db'}"
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        return url
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def database_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """Each SQL backend in turn, migrated: the store contract holds on all of them."""
    return _migrated_url(request, backend, tmp_path)


@pytest.fixture
def store(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[Store]:
    """Each backend in turn, SQL and in memory: the store contract holds on all of them."""
    if backend == "memory":
        yield MemoryStore()
        return
    s = SQLStore.from_url(_migrated_url(request, backend, tmp_path))
    yield s
    s.close()


@pytest.fixture
def sql_store(database_url: str) -> Iterator[SQLStore]:
    """Each SQL backend in turn, for a test of what only SQL has (statements
    counted, raw SQL, the engine's events, migrations): never in memory."""
    s = SQLStore.from_url(database_url)
    yield s
    s.close()


@pytest.fixture
def memory_store() -> MemoryStore:
    """An empty in-memory store: the engine's unit tests need no database."""
    return MemoryStore()


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[SQLStore]:
    engine = make_engine(sqlite_url)
    upgrade(engine)
    s = SQLStore(engine)
    yield s
    s.close()


@pytest.fixture
def redis_url() -> str:
    """A Redis database of its own, flushed before the test."""
    require("redis")
    url = f"{REDIS_URL}/{REDIS_CACHE_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Cluster]]:
    """Build a worker cluster for a broker: ``filesystem`` is the embedded default
    (SQLite); ``redis`` and ``rabbitmq`` are production shapes (PostgreSQL + Redis cache).
    Keyword arguments override HARNESS_* settings (``HARNESS_LEASE_TTL="6"``)."""
    with ExitStack() as stack:

        def make(broker: str, **overrides: str) -> Cluster:
            if broker == "filesystem":
                db, cache = f"sqlite:///{tmp_path / 'harness.db'}", None
            else:
                db = request.getfixturevalue("postgres_url")
                cache = request.getfixturevalue("redis_url")
            return stack.enter_context(cluster(broker, tmp_path, db, cache, monkeypatch, overrides))

        yield make


@pytest.fixture(params=["filesystem", "redis", "rabbitmq"])
def any_cluster(request: pytest.FixtureRequest, make_cluster: Callable[[str], Cluster]) -> Cluster:
    return make_cluster(request.param)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Iterator[WireServer]:
    """A local server of the OpenAI and Anthropic wire formats (tests/wire.py),
    and the SDKs' variables pointing at it: set before a cluster is made, so
    its workers inherit them."""
    with WireServer() as server:
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_base_url)
        yield server


# --- Service markers (tests tiered honestly) -------------------------------------
# Every test that reaches PostgreSQL, Redis or RabbitMQ carries the marker of each,
# so that `-m "not postgres and not redis and not rabbitmq"` (make test-fast) selects
# exactly the tests that need no service. The markers follow from the fixtures a test
# uses and the backends it is parametrized over; a test that reaches a service some
# other way carries the marker by hand, and services.require() fails a test that
# asks for a service its markers do not name, so a missing one cannot go unnoticed.

#: Fixtures that are a service themselves.
SERVICE_FIXTURES = {"postgres_url": {"postgres"}, "redis_url": {"redis"}}
#: Parameter values that name a backend (database_url, any_cluster, a ``broker``
#: parameter...). A cluster on Redis or RabbitMQ is the production shape: PostgreSQL
#: for the runs and Redis for the idempotency cache, besides its broker.
SERVICE_PARAMS = {"postgresql": {"postgres"}, "redis": {"redis"}, "rabbitmq": {"rabbitmq"}}
CLUSTER_FIXTURE = "make_cluster"
CLUSTER_SERVICES = {"postgres", "redis"}


def services_of(item: pytest.Item) -> set[str]:
    """The services ``item`` reaches through its fixtures and parameters."""
    fixtures = set(getattr(item, "fixturenames", ()))
    found: set[str] = set()
    for name, needed in SERVICE_FIXTURES.items():
        if name in fixtures:
            found |= needed
    callspec = getattr(item, "callspec", None)
    for value in callspec.params.values() if callspec is not None else ():
        if isinstance(value, str) and value in SERVICE_PARAMS:
            found |= SERVICE_PARAMS[value]
            if CLUSTER_FIXTURE in fixtures:
                found |= CLUSTER_SERVICES
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for service in sorted(services_of(item)):
            item.add_marker(service)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    services.current_test = services.RunningTest(
        item.nodeid, {marker.name for marker in item.iter_markers()}
    )


def pytest_runtest_teardown(item: pytest.Item) -> None:
    services.current_test = None
