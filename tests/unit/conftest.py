"""The unit tier's two rules, enforced: a unit test reaches no service and does not sleep.

A unit test runs on SQLite (or the in-memory store) with a hand-moved clock: it must
pass on a machine with no PostgreSQL, Redis or RabbitMQ, and take milliseconds. A test
that needs a service belongs in tests/integration (or tests/contract, parametrized over
the backends) with its marker; a test that waits on real time should move a clock
instead. Both rules are checked here, for every test under tests/unit, rather than
trusted: connecting to a service's port, opening a PostgreSQL connection, or calling
``time.sleep`` for longer than :data:`MAX_SLEEP` fails the test with a message that
says which rule it broke. Servers a test starts itself (tests/wire.py's provider
server, an HTTP app) listen on ports of their own and are not affected.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.services import PORTS, POSTGRES_ADMIN_URL, RABBITMQ_URL, REDIS_URL

#: The longest sleep a unit test may take, seconds: a yield to another thread, not a wait.
MAX_SLEEP = 0.05
#: RabbitMQ's management port, besides the ports the services' URLs name.
RABBITMQ_MANAGEMENT_PORT = 15672
_URLS = (POSTGRES_ADMIN_URL, REDIS_URL, RABBITMQ_URL)
SERVICE_PORTS = frozenset(
    {*PORTS.values(), RABBITMQ_MANAGEMENT_PORT} | {p for url in _URLS if (p := urlsplit(url).port)}
)
MOVE_IT = "move it to tests/integration with its marker, or give it an in-memory backend"


class Violations:
    """The rules a test broke. Broken in the test's own thread, the test fails there;
    broken in a thread it started (a worker, a heartbeat), where the failure may be
    caught or lost, the test fails at teardown too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._test_thread = threading.current_thread()
        self.in_other_threads: list[str] = []

    def fail(self, message: str) -> None:
        if threading.current_thread() is not self._test_thread:
            with self._lock:
                self.in_other_threads.append(message)
        pytest.fail(message, pytrace=False)


def _port_of(address: Any) -> int | None:
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        return address[1]
    return None


def _guard_connect(
    violations: Violations, connect: Callable[[socket.socket, Any], Any]
) -> Callable[[socket.socket, Any], Any]:
    def guarded(sock: socket.socket, address: Any) -> Any:
        port = _port_of(address)
        if port in SERVICE_PORTS:
            sock.close()  # its caller (socket.create_connection) closes only on OSError
            violations.fail(f"a unit test connected to a service at {address!r}: {MOVE_IT}")
        return connect(sock, address)

    return guarded


def _guard_sleep(violations: Violations, sleep: Callable[[float], None]) -> Callable[[float], None]:
    def guarded(seconds: float) -> None:
        if seconds > MAX_SLEEP:
            violations.fail(
                f"a unit test slept {seconds:g}s (more than {MAX_SLEEP}s): move a clock "
                "(tests/rig.py's, or a `clock` parameter) instead of waiting on real time"
            )
        sleep(seconds)

    return guarded


@pytest.fixture(autouse=True)
def _unit_tier_rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a unit test that reaches a service or sleeps (see the module docstring)."""
    violations = Violations()
    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(
            socket.socket, name, _guard_connect(violations, getattr(socket.socket, name))
        )

    # libpq opens PostgreSQL's socket itself, out of the socket module's sight.
    real_connect = psycopg.Connection.connect

    def no_postgres(conninfo: str = "", **kwargs: Any) -> psycopg.Connection[Any]:
        params = conninfo_to_dict(conninfo, **kwargs)
        if int(str(params.get("port") or 5432)) in SERVICE_PORTS:
            violations.fail(f"a unit test opened a PostgreSQL connection ({params}): {MOVE_IT}")
        return real_connect(conninfo, **kwargs)

    monkeypatch.setattr(psycopg, "connect", no_postgres)
    monkeypatch.setattr(psycopg.Connection, "connect", staticmethod(no_postgres))
    monkeypatch.setattr(time, "sleep", _guard_sleep(violations, time.sleep))
    yield
    if violations.in_other_threads:
        pytest.fail("; ".join(violations.in_other_threads), pytrace=False)


@pytest.fixture(autouse=True)
def _close_provider_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every SDK client a test's provider models made is closed when the test ends.

    A client left to the garbage collector warns of its unclosed socket
    (ResourceWarning) in whichever test happens to be running when it is
    collected, and warnings are errors here: that test would fail for another's
    leak, now and then. A model that outlives the test makes a new client when
    it is next used.
    """
    from harness.providers.anthropic import AnthropicModel
    from harness.providers.openai import OpenAIModel

    made: list[tuple[Any, Any]] = []
    for cls in (OpenAIModel, AnthropicModel):
        make = cls._make_client

        def recorded(self: Any, make: Callable[[Any], Any] = make) -> Any:
            client = make(self)
            made.append((self, client))
            return client

        monkeypatch.setattr(cls, "_make_client", recorded)
    yield
    for model, client in made:
        client.close()
        if model._client is client:  # a model another test reuses makes a new one
            model._client = None
