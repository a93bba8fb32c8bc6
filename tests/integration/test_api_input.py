"""The HTTP app in this process (Starlette's TestClient), on each store
backend: what its doors refuse, and what ``/healthz`` asks of the store.

Bad input must be answered 422 naming the field, never reach the store
(PostgreSQL refuses a NUL in text, and its ``integer`` columns end at
2**31-1, which a read used to report as an outage, 503), and never be
stored altered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from starlette.testclient import TestClient

from harness import api
from harness.clock import SystemClock
from harness.reads import Reads
from harness.records import RunStatus, Step, StepKind, StepStatus
from harness.store.sql import SQLStore
from harness.web.app import create_app
from tests.web import chain_steps, seed_run

TOKEN = "in-process-token"
BIG = 2**31  # one past the largest value of PostgreSQL's integer


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


def send(client: TestClient, method: str, path: str, body: Any = None) -> Any:
    # Escaped JSON: a lone surrogate travels as \ud800, as a real client sends it.
    content = None if body is None else json.dumps(body)
    headers = {"Content-Type": "application/json"}
    return client.request(method, path, content=content, headers=headers)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


BAD_INPUT: list[tuple[str, str, Any, str]] = [
    ("POST", "/api/runs", {"agent": "chain", "goal": "a\x00b"}, "body.goal"),
    ("POST", "/api/runs", {"agent": "chain", "goal": "a\ud800b"}, "body.goal"),
    ("POST", "/api/runs", {"agent": "ch\x00ain", "goal": "g"}, "body.agent"),
    ("POST", "/api/runs/r1/cancel", {"reason": "a\x00b"}, "body.reason"),
    ("POST", "/api/runs/r1/reject", {"reason": "no\x00"}, "body.reason"),
    ("POST", "/api/runs/r1/approve", {"step": BIG}, "body.step"),
    ("POST", "/api/runs/r1/reject", {"reason": "no", "step": BIG}, "body.step"),
    ("POST", "/api/runs/r1/resume", {"max_tokens": BIG}, "body.max_tokens"),
    ("POST", "/api/runs/r1/resume", {"max_cost_usd": float("inf")}, "body.max_cost_usd"),
    ("POST", "/api/runs/r1/approve", {"args": {"a": nested(100)}}, "body.args"),
    ("POST", "/api/runs/r1/resolve", {"decision": "fail", "result": nested(100)}, "body.result"),
    ("POST", "/api/runs/r1/resolve", {"decision": "fail", "result": 10**1001}, "body.result"),
    ("GET", "/api/runs/a%00b", None, "path.run_id"),
    ("GET", "/api/runs/a%00b/steps", None, "path.run_id"),
    ("GET", "/api/runs/a%00b/history", None, "path.run_id"),
    ("POST", "/api/runs/a%00b/cancel", {}, "path.run_id"),
    ("POST", "/api/runs/a%00b/pause", {}, "path.run_id"),
    ("GET", "/api/runs?agent=a%00b", None, "query.agent"),
    ("GET", "/api/runs?forked_from=a%00b", None, "query.forked_from"),
    ("GET", "/api/runs?replay_of=a%00b", None, "query.replay_of"),
    ("GET", "/api/runs?created_after=nan", None, "query.created_after"),
    ("GET", "/api/runs?created_before=inf", None, "query.created_before"),
    ("GET", "/api/runs/r1/steps?start=1e20", None, "query.start"),
    ("GET", f"/api/runs/r1/steps?start={BIG}", None, "query.start"),
    ("GET", "/api/runs/r1/history?after=1e20", None, "query.after"),
    ("GET", f"/api/runs/r1/history?after={BIG}", None, "query.after"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), BAD_INPUT)
def test_bad_input_is_a_422_naming_the_field(
    client: TestClient, method: str, path: str, body: Any, field: str
) -> None:
    answer = send(client, method, path, body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith(f"{field}: "), answer.text
    run = client.get("/api/runs/r1", params={"steps": "false"}).json()
    assert (run["status"], run["version"], run["max_tokens"]) == ("paused", 1, None)


def test_the_largest_integers_the_store_holds_are_read(client: TestClient) -> None:
    steps = client.get("/api/runs/r1/steps", params={"start": BIG - 1})
    assert steps.json() == {"steps": [], "total": 3, "next_start": None}
    history = client.get("/api/runs/r1/history", params={"after": BIG - 1})
    assert history.json() == {"events": [], "next_after": None}


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


def seed_awaiting(store: SQLStore, run_id: str) -> None:
    """A run of the approver agent whose first charge awaits an operator's word."""
    steps = [
        Step(run_id, 0, StepKind.MODEL, StepStatus.DONE, attempts=1, args={"turn": 0},
             result={"tool_calls": [{"name": "charge", "args": {"amount": 10}}]}),
        Step(run_id, 1, StepKind.TOOL, StepStatus.AWAITING_APPROVAL, tool="charge",
             args={"amount": 10}),
    ]  # fmt: skip
    seed_run(store, run_id, steps, status=RunStatus.WAITING, agent="approver", cursor=1)


def test_the_operator_named_in_a_body_is_recorded(client: TestClient) -> None:
    seed_awaiting(api.reads().store, "a1")
    approved = send(client, "POST", "/api/runs/a1/approve", {"by": "Ada Lovelace"})
    assert approved.status_code == 200, approved.text
    step = client.get("/api/runs/a1").json()["steps"][1]
    assert step["approval"]["by"] == "Ada Lovelace"
    seed_awaiting(api.reads().store, "a2")
    rejected = send(client, "POST", "/api/runs/a2/reject", {"reason": "no", "by": "Grace"})
    assert rejected.status_code == 200, rejected.text
    assert client.get("/api/runs/a2").json()["steps"][1]["approval"]["by"] == "Grace"
    resumed = send(client, "POST", "/api/runs/r1/resume", {"by": "Ada Lovelace"})
    assert resumed.status_code == 200, resumed.text
    paused = send(client, "POST", "/api/runs/r1/pause", {"by": "Grace"})
    assert paused.status_code == 200, paused.text
    details = [e["detail"] for e in client.get("/api/runs/r1/history").json()["events"]]
    assert "resumed by Ada Lovelace" in details and "by Grace" in details, details
    # Unnamed, the API is the operator, as before.
    seed_awaiting(api.reads().store, "a3")
    assert send(client, "POST", "/api/runs/a3/approve", {}).status_code == 200
    assert client.get("/api/runs/a3").json()["steps"][1]["approval"]["by"] == "api"


@pytest.mark.parametrize("by", ["", "a\x00b", "x" * 201])
def test_an_operator_name_that_cannot_be_stored_is_refused(client: TestClient, by: str) -> None:
    answer = send(client, "POST", "/api/runs/r1/resume", {"by": by})
    assert answer.status_code == 422 and answer.json()["detail"].startswith("body.by: ")
    assert client.get("/api/runs/r1", params={"steps": "false"}).json()["status"] == "paused"
