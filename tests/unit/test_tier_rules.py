"""The unit tier's rules (tests/unit/conftest.py) catch what they say they catch:
a connection to a service, a PostgreSQL connection made by libpq, a sleep, and
each of those in a thread the test started; and let through what is allowed."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import psycopg
import pytest
from sqlalchemy import create_engine

from tests import services
from tests.conftest import services_of
from tests.services import PORTS
from tests.unit.conftest import MAX_SLEEP, Violations, _guard_sleep

Failed = pytest.fail.Exception


@pytest.mark.parametrize("service", sorted(PORTS))
def test_a_connection_to_a_service_port_fails_the_test(service: str) -> None:
    with pytest.raises(Failed, match="connected to a service at"):
        socket.create_connection(("127.0.0.1", PORTS[service]), timeout=1)


def test_a_postgresql_connection_fails_the_test_before_libpq_opens_it() -> None:
    with pytest.raises(Failed, match="opened a PostgreSQL connection"):
        psycopg.connect("host=127.0.0.1 dbname=harness user=postgres")
    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/harness")
    with pytest.raises(Failed, match="opened a PostgreSQL connection"):
        engine.connect()
    engine.dispose()


def test_a_postgresql_url_on_another_port_is_left_to_fail_on_its_own() -> None:
    """The CLI's tests of an unreachable store point at a port where nothing listens."""
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect("host=127.0.0.1 port=1 dbname=x connect_timeout=1")


def test_a_loopback_server_of_the_tests_own_is_reachable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname()[:2], timeout=1)
        conn, _ = server.accept()
        conn.close()
        client.close()


def test_a_sleep_longer_than_a_yield_fails_the_test() -> None:
    time.sleep(MAX_SLEEP / 10)  # a yield to another thread is allowed
    with pytest.raises(Failed, match=r"slept 0\.5s"):
        time.sleep(0.5)
    slept: list[float] = []
    guarded = _guard_sleep(Violations(), slept.append)
    guarded(MAX_SLEEP / 10)
    with pytest.raises(Failed):
        guarded(0.5)
    assert slept == [MAX_SLEEP / 10], "it failed without sleeping"


def test_a_rule_broken_in_another_thread_is_kept_for_the_teardown() -> None:
    violations = Violations()
    caught: list[BaseException] = []

    def broken() -> None:
        try:
            violations.fail("slept in a worker thread")
        except BaseException as err:  # what a thread's own code might swallow
            caught.append(err)

    thread = threading.Thread(target=broken)
    thread.start()
    thread.join()
    assert len(caught) == 1 and isinstance(caught[0], Failed)
    assert violations.in_other_threads == ["slept in a worker thread"]
    with pytest.raises(Failed):
        violations.fail("in the test's own thread")
    assert violations.in_other_threads == ["slept in a worker thread"]  # failed there already


def test_a_test_asking_for_a_service_it_is_not_marked_with_fails(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """services.require() reads the markers tests/conftest.py applied: this test has none."""
    assert services.current_test == services.RunningTest(request.node.nodeid, set())
    with pytest.raises(Failed, match=r"uses redis but is not marked: add @pytest.mark.redis"):
        services.require("redis")
    marked = services.RunningTest(request.node.nodeid, {"redis"})
    monkeypatch.setattr(services, "current_test", marked)
    with pytest.raises(Failed, match="connected to a service"):  # on to the service itself
        services.require("redis")


class _Item:
    """What services_of() reads of a collected test: its fixtures and parameters."""

    def __init__(self, fixtures: list[str], **params: object) -> None:
        self.fixturenames = fixtures
        self.callspec = SimpleNamespace(params=params) if params else None


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (_Item(["sqlite_store", "tmp_path"]), set()),
        (_Item(["store", "database_url"], database_url="sqlite"), set()),
        (_Item(["store", "database_url"], database_url="postgresql"), {"postgres"}),
        (_Item(["database_url", "postgres_url"], database_url="postgresql"), {"postgres"}),
        (_Item(["redis_url"]), {"redis"}),
        (_Item(["make_cluster"], broker="filesystem"), set()),
        (_Item(["make_cluster"], broker="redis"), {"postgres", "redis"}),
        (_Item(["any_cluster", "make_cluster"], any_cluster="rabbitmq"), PORTS.keys()),
        (_Item(["server", "make_cluster"], server="postgresql"), {"postgres", "redis"}),
        (_Item(["celery_app"], broker="redis://r:6379/0"), set()),  # a URL, never connected to
    ],
)
def test_the_services_a_test_reaches_follow_from_its_fixtures_and_parameters(
    item: _Item, expected: set[str]
) -> None:
    assert services_of(item) == set(expected)  # type: ignore[arg-type]
