"""Reachability of the real services, and the skip-or-fail rule.

A service-backed test skips with a reason when its service is down, and
fails instead when HARNESS_REQUIRE_SERVICES=1 (as in .ci/run).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest

POSTGRES_ADMIN_URL = os.environ.get(
    "HARNESS_TEST_POSTGRES_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
#: Under pytest-xdist (``make test`` runs three processes), each process has
#: services of its own: its PostgreSQL database, Redis databases and RabbitMQ
#: vhost, so that one process's flush or purge never touches the other's.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_INDEX = int(XDIST_WORKER[2:]) if XDIST_WORKER.startswith("gw") else 0
_SUFFIX = f"_{XDIST_WORKER}" if _INDEX else ""
POSTGRES_TEST_DB = os.environ.get("HARNESS_TEST_PG_DB", "harness_test") + _SUFFIX
REDIS_URL = os.environ.get("HARNESS_TEST_REDIS", "redis://127.0.0.1:6379")
#: The Redis databases of the test clusters' broker, of the idempotency cache
#: and of the rate limiter (flushed by the tests), and two for an app of the
#: user's own: give a second suite on the same machine others, as
#: HARNESS_TEST_PG_DB gives it its own PostgreSQL database. An xdist process
#: takes the five below the previous one's.
_REDIS_SPAN = 5
REDIS_CACHE_DB = int(os.environ.get("HARNESS_TEST_REDIS_CACHE_DB", "15")) - _REDIS_SPAN * _INDEX
REDIS_BROKER_DB = int(os.environ.get("HARNESS_TEST_REDIS_BROKER_DB", "14")) - _REDIS_SPAN * _INDEX
REDIS_LIMIT_DB = int(os.environ.get("HARNESS_TEST_REDIS_LIMIT_DB", "13")) - _REDIS_SPAN * _INDEX
REDIS_APP_DBS = (
    int(os.environ.get("HARNESS_TEST_REDIS_APP_DB", "12")) - _REDIS_SPAN * _INDEX,
    int(os.environ.get("HARNESS_TEST_REDIS_APP_DB", "12")) - 1 - _REDIS_SPAN * _INDEX,
)
assert min(REDIS_APP_DBS) >= 0, f"too many xdist processes for Redis's 16 databases: {_INDEX}"
RABBITMQ_URL = os.environ.get("HARNESS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
if _INDEX:
    RABBITMQ_URL = RABBITMQ_URL.rsplit("/", 1)[0].rstrip("/") + f"/harness{_SUFFIX}"

PORTS = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672}


@dataclass(frozen=True)
class RunningTest:
    """The test being run in this process and the markers it carries (set by
    tests/conftest.py), so that :func:`require` can check them."""

    nodeid: str
    markers: set[str]


current_test: RunningTest | None = None


def reachable(service: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", PORTS[service]), timeout=1):
            return True
    except OSError:
        return False


def require(service: str) -> None:
    """Skip (or fail, under HARNESS_REQUIRE_SERVICES=1) when ``service`` is down.

    A test that asks for a service must carry its marker (``@pytest.mark.redis``...):
    ``make test-fast`` deselects by marker, and a test that slipped through would
    reach a service there."""
    test = current_test
    if test is not None and service not in test.markers:
        pytest.fail(
            f"{test.nodeid} uses {service} but is not marked: add @pytest.mark.{service} "
            "(tests/conftest.py marks the tests that use a service fixture or parameter)"
        )
    if reachable(service):
        if service == "rabbitmq" and _INDEX:
            _own_vhost()
        return
    reason = f"{service} is not reachable on 127.0.0.1:{PORTS[service]}"
    if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}, and HARNESS_REQUIRE_SERVICES=1")
    pytest.skip(reason)


_vhost_made = False


def _own_vhost() -> None:
    """This xdist process's RabbitMQ vhost, made once (rabbitmqctl, as the
    service restarts use)."""
    global _vhost_made
    if _vhost_made:
        return
    vhost = RABBITMQ_URL.rsplit("/", 1)[1]
    for command in (
        ["rabbitmqctl", "-q", "add_vhost", vhost],
        ["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
    ):
        subprocess.run(command, capture_output=True, timeout=60, check=False)
    _vhost_made = True


def _wait_port(service: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not reachable(service):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{service} did not come back within {seconds}s")
        time.sleep(0.1)


RESTART = {
    "redis": [
        "redis-cli -h 127.0.0.1 -p 6379 shutdown nosave || true",
        'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
        "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
    ],
    "postgres": [
        "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart",
    ],
    "rabbitmq": ["rabbitmqctl -q stop_app", "rabbitmqctl -q start_app"],
}
TOOLS = {"redis": "redis-server", "postgres": "pg_ctlcluster", "rabbitmq": "rabbitmqctl"}


def restart(service: str) -> None:
    """Restart a local service the way an operator (or a crash) would. Blocks until it is back."""
    if shutil.which(TOOLS[service]) is None:
        reason = f"cannot restart {service} here: {TOOLS[service]} is not installed"
        if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    for command in RESTART[service]:
        subprocess.run(command, shell=True, check=True, capture_output=True, timeout=120)
        time.sleep(0.2)
    _wait_port(service, 60)
