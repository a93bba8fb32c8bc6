"""Reachability of the real services, and the skip-or-fail rule.

A service-backed test skips with a reason when its service is down, and
fails instead when HARNESS_REQUIRE_SERVICES=1 (as in .ci/run).
"""

from __future__ import annotations

import os
import socket

import pytest

POSTGRES_ADMIN_URL = os.environ.get(
    "HARNESS_TEST_POSTGRES_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
POSTGRES_TEST_DB = os.environ.get("HARNESS_TEST_PG_DB", "harness_test")
REDIS_URL = os.environ.get("HARNESS_TEST_REDIS", "redis://127.0.0.1:6379")
RABBITMQ_URL = os.environ.get("HARNESS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")

PORTS = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672}


def reachable(service: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", PORTS[service]), timeout=1):
            return True
    except OSError:
        return False


def require(service: str) -> None:
    """Skip (or fail, under HARNESS_REQUIRE_SERVICES=1) when ``service`` is down."""
    if reachable(service):
        return
    reason = f"{service} is not reachable on 127.0.0.1:{PORTS[service]}"
    if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}, and HARNESS_REQUIRE_SERVICES=1")
    pytest.skip(reason)
