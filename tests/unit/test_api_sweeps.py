"""The HTTP API's read model of sweeps, in process (FastAPI's test client on
SQLite): ``last_sweep_age_s`` in ``/api/stats``, the gauge in ``/metrics``,
an ``unswept`` run's attention, and a step abandoned in a run that ended."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import get_args

import pytest
from fastapi.testclient import TestClient

from harness import api
from harness.clock import SystemClock
from harness.engine import recovery, transitions
from harness.reads import ATTENTION, Reads
from harness.settings import Settings
from harness.store.sql import SQLStore
from harness.web import schemas
from harness.web.app import create_app
from tests.rig import insert_run

TOKEN = "sweeps-test-token"


@pytest.fixture
def client(
    sqlite_store: SQLStore, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestClient]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)  # the operator actions' store
    reads = Reads(sqlite_store, SystemClock(), running_alert=900.0, sweep_interval=5.0)
    app = create_app(TOKEN, reads, Settings.from_env({}))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def _dead_worker_run(store: SQLStore, lapsed_ago: float) -> str:
    run = insert_run(store, "r1")
    assert run.current is not None
    then = time.time() - lapsed_ago - 10
    store.checkpoint(transitions.claim(run, run.current, worker="w1@h:9/1", now=then, ttl=10))
    return run.run_id


def test_stats_and_metrics_carry_the_last_sweeps_age(
    client: TestClient, sqlite_store: SQLStore
) -> None:
    assert client.get("/api/stats").json()["last_sweep_age_s"] is None
    assert "harness_last_sweep_age_seconds +Inf" in client.get("/metrics").text
    recovery.sweep(api.runtime())  # `harness sweep`
    age = client.get("/api/stats").json()["last_sweep_age_s"]
    assert 0 <= age < 5


def test_a_run_whose_lease_lapsed_with_no_sweep_since_is_unswept(
    client: TestClient, sqlite_store: SQLStore
) -> None:
    run_id = _dead_worker_run(sqlite_store, lapsed_ago=30)
    (listed,) = client.get("/api/runs").json()["runs"]
    assert listed["attention"] == "unswept"
    # Read on the wall clock a moment after the lease was written to lapse 30 s ago.
    detail = listed["attention_detail"]
    assert re.match(r"lease expired 3\ds ago and no sweep has run since", detail), detail
    for params in ({}, {"steps": "false"}):
        shown = client.get(f"/api/runs/{run_id}", params=params)
        assert shown.status_code == 200, shown.text
        assert shown.json()["attention"] == "unswept"


def test_a_step_left_running_by_a_cancel_is_abandoned(
    client: TestClient, sqlite_store: SQLStore
) -> None:
    run_id = _dead_worker_run(sqlite_store, lapsed_ago=0)
    assert client.get(f"/api/runs/{run_id}").json()["steps"][0]["abandoned"] is False
    assert client.post(f"/api/runs/{run_id}/cancel", json={}).status_code == 200
    (step,) = client.get(f"/api/runs/{run_id}").json()["steps"]
    assert (step["status"], step["abandoned"]) == ("running", True)
    assert client.get(f"/api/runs/{run_id}/steps").json()["steps"] == [step]


def test_the_api_schema_knows_every_attention_code() -> None:
    assert get_args(schemas.Attention) == ATTENTION
