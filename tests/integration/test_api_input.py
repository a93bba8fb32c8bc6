"""The HTTP app in this process (Starlette's TestClient), on each store
backend: what its doors refuse, and what ``/healthz`` asks of the store.

Bad input must be answered 422 naming the field, never reach the store
(PostgreSQL refuses a NUL in text, and its ``integer`` columns end at
2**31-1, which a read used to report as an outage, 503), and never be
stored altered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from starlette.testclient import TestClient

from harness import api
from harness.engine.leases import SystemClock
from harness.reads import Reads
from harness.records import RunStatus
from harness.store.sql import SQLStore
from harness.web.app import create_app
from tests.web import chain_steps, seed_run

TOKEN = "in-process-token"


@pytest.fixture
def client(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestClient]:
    """The app on this backend's store, as ``harness serve`` makes it."""
    monkeypatch.setenv("HARNESS_DATABASE_URL", database_url)
    monkeypatch.setenv("HARNESS_BROKER_URL", "filesystem://")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    api.reset_runtime()
    seed_run(api.reads().store, "r1", chain_steps("r1", 3), status=RunStatus.PAUSED)
    app = create_app(TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app, headers=headers, raise_server_exceptions=False) as c:
        yield c


def test_healthz_pings_the_store_without_reading_a_table(client: TestClient) -> None:
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = api.reads().store.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        answer = client.get("/healthz", headers={"Authorization": ""})
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert (answer.status_code, answer.json()) == (200, {"ok": True, "store": "ok"})
    assert statements and not [s for s in statements if "harness_" in s], statements


@pytest.mark.parametrize(
    "url",
    ["sqlite:////no/such/directory/harness.db", "postgresql+psycopg://nobody@127.0.0.1:1/none"],
)
def test_healthz_says_when_the_store_does_not_answer(url: str) -> None:
    store = SQLStore.from_url(url)
    app = create_app(TOKEN, Reads(store, SystemClock(), 60.0))
    try:
        with TestClient(app) as client:
            answer = client.get("/healthz")
        assert (answer.status_code, answer.json()) == (503, {"ok": False, "store": "unreachable"})
    finally:
        store.close()
