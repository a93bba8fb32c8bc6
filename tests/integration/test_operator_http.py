"""Operator actions over HTTP against a real ``harness serve``, on the
embedded store (SQLite) and on PostgreSQL, where racing creates were seen
to both get 201.

Requests race from threads of this process; the runs are moved in-process
(``run_step``, as a worker would) on the same store, so no worker is needed.
An action answers 200 with ``changed`` (false: the run had this very
decision already) or 409 with what the run has instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from harness import api
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from tests.apiserver import ApiServer
from tests.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PAIRS = 10


@pytest.fixture(params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, make_cluster: Callable[..., Cluster]
) -> Iterator[ApiServer]:
    cluster = make_cluster("filesystem" if request.param == "sqlite" else "redis")
    s = ApiServer(cluster.env, cluster.home)
    api.ensure_agents()
    yield s
    s.stop()


def race(server: ApiServer, *requests: tuple[str, dict[str, Any]]) -> list[httpx.Response]:
    """POST each (path, body) from its own thread and client, released at once."""
    gate = threading.Barrier(len(requests))
    answers: list[Any] = [None] * len(requests)

    def post(i: int, path: str, body: dict[str, Any]) -> None:
        with server.client() as client:
            gate.wait()
            answers[i] = client.post(path, json=body)

    threads = [threading.Thread(target=post, args=(i, *r)) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


def drive(run_id: str) -> TaskResult:
    outcome = TaskResult.ADVANCED
    for _ in range(10):
        outcome = run_step(api.runtime(), run_id)
        if outcome is not TaskResult.ADVANCED:
            break
    return outcome


def test_racing_creates_of_one_id_have_one_winner(server: ApiServer) -> None:
    for i in range(PAIRS):
        run_id = f"two-goals-{i}"
        answers = race(
            server,
            ("/api/runs", {"agent": "chain", "goal": "goal A", "run_id": run_id}),
            ("/api/runs", {"agent": "chain", "goal": "goal B", "run_id": run_id}),
        )
        assert sorted(a.status_code for a in answers) == [201, 409], [a.text for a in answers]
        won = next(i for i, a in enumerate(answers) if a.status_code == 201)
        goal = ("goal A", "goal B")[won]
        assert api.get_run(run_id).goal == goal
        lost = answers[1 - won].json()
        assert lost["detail"] == (
            f"run {run_id} exists with agent chain and goal {goal!r}: another run, not created"
        )
        assert lost["status"] == "pending"
    for i in range(PAIRS):
        body = {"agent": "chain", "goal": "goal A", "run_id": f"one-goal-{i}"}
        answers = race(server, ("/api/runs", body), ("/api/runs", body))
        assert sorted(a.status_code for a in answers) == [200, 201], [a.text for a in answers]
        assert all(a.json() == {"run_id": f"one-goal-{i}"} for a in answers)


def test_a_decision_that_did_not_take_effect_is_a_conflict(server: ApiServer) -> None:
    with server.client() as client:
        body = {"agent": "approver", "goal": "charge three", "run_id": "decide"}
        assert client.post("/api/runs", json=body).status_code == 201
        assert drive("decide") is TaskResult.WAITING
        approved = client.post("/api/runs/decide/approve", json={"step": 1})
        assert approved.status_code == 200
        assert (approved.json()["changed"], approved.json()["message"]) == (
            True,
            "step 1 approved by api",
        )
        again = client.post("/api/runs/decide/approve", json={"step": 1})
        assert again.status_code == 200
        assert (again.json()["changed"], again.json()["message"]) == (
            False,
            "step 1 was already approved by api",
        )
        rejected = client.post("/api/runs/decide/reject", json={"step": 1, "reason": "no"})
        assert rejected.status_code == 409
        assert rejected.json() == {
            "detail": "run decide is running: step 1 was already approved by api; nothing changed",
            "status": "running",
        }

        # The next call: two operators approve it with other arguments at once.
        assert drive("decide") is TaskResult.WAITING
        answers = race(
            server,
            ("/api/runs/decide/approve", {"step": 2, "args": {"amount": 21}}),
            ("/api/runs/decide/approve", {"step": 2, "args": {"amount": 22}}),
        )
        assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
        amount = 21 if answers[0].status_code == 200 else 22
        conflict = next(a for a in answers if a.status_code == 409).json()["detail"]
        assert f'step 2 was already approved by api with {{"amount": {amount}}}' in conflict
        drive("decide")
        step = client.get("/api/runs/decide").json()["steps"][2]
        assert step["result"]["charged"] == amount


def test_a_cancel_that_came_after_the_end_is_a_conflict(server: ApiServer) -> None:
    with server.client() as client:
        client.post("/api/runs", json={"agent": "chain", "goal": "g", "run_id": "ended"})
        assert drive("ended") is TaskResult.COMPLETED
        late = client.post("/api/runs/ended/cancel", json={})
        assert late.status_code == 409
        assert late.json() == {
            "detail": "run ended has completed; nothing changed",
            "status": "completed",
        }
        client.post("/api/runs", json={"agent": "chain", "goal": "g", "run_id": "stopped"})
        assert client.post("/api/runs/stopped/cancel", json={}).json()["changed"] is True
        again = client.post("/api/runs/stopped/cancel", json={"reason": "twice"})
        assert again.status_code == 200
        assert (again.json()["changed"], again.json()["message"]) == (
            False,
            "already cancelled: cancelled by operator",
        )


def test_operator_bodies_that_no_column_can_hold_are_refused(server: ApiServer) -> None:
    deep: Any = 1
    for _ in range(600):
        deep = [deep]
    with server.client() as client:
        client.post("/api/runs", json={"agent": "approver", "goal": "g", "run_id": "door"})
        answers = {
            "result": client.post(
                "/api/runs/door/resolve", json={"decision": "succeeded", "result": deep}
            ),
            "args": client.post(
                "/api/runs/door/approve",
                content='{"args": {"amount": NaN}}',
                headers={"Content-Type": "application/json"},
            ),
            "reason": client.post("/api/runs/door/cancel", json={"reason": "no\u0000"}),
            "goal": client.post("/api/runs", json={"agent": "chain", "goal": "a \u0000 goal"}),
        }
        for field, answer in answers.items():
            assert answer.status_code == 422, (field, answer.text)
            detail = answer.json()["detail"]
            assert detail.startswith((f"{field}: ", f"body.{field}: ")), (field, answer.text)
        assert client.get("/api/runs/door").json()["status"] == "pending"
