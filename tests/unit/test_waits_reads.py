"""What the reads say of runs that wait on the world, on the embedded store:
``show`` (text and ``--json``) and ``GET /api/runs/{id}`` name what each
deferred call waits for and until when, a parent lists its children and a
child names its parent; a parent whose child waits on an operator is
``child_waiting``, a run waiting only on its deferred calls needs no one;
``list --status waiting``, ``stats`` (the oldest wait) and ``/metrics``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from harness import api
from harness.cli import main
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus
from harness.web.app import create_app

TOKEN = "reads-test-token"


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents,tests.door_wait_agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_TEST_LEDGER", str(tmp_path / "ledger.txt"))
    monkeypatch.setenv("HARNESS_CALLBACK_SECRET", "r" * 32)
    api.reset_runtime()
    yield
    api.reset_runtime()


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(TOKEN), headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), terminal_width=200)


def drive(run_id: str) -> RunStatus:
    for _ in range(10):
        if run_step(api.runtime(), run_id) is not TaskResult.ADVANCED:
            break
    return api.get_run(run_id).status


def started(agent: str, goal: str = "go") -> str:
    api.ensure_agents()
    run_id = api.start_run(agent, goal)
    assert drive(run_id) is RunStatus.WAITING
    return run_id


def test_a_run_waiting_on_a_signal_shows_it_and_needs_no_operator(client: TestClient) -> None:
    run_id = started("d-payer")
    shown = json.loads(invoke("show", run_id, "--json").output)
    assert (shown["status"], shown["attention"], shown["children"]) == ("waiting", None, [])
    step = shown["steps"][1]
    assert step["status"] == "deferred"
    assert step["wait"]["kind"] == "signal" and step["wait"]["signal"] == "paid"
    assert step["waits_for"].startswith("signal 'paid' until 20")
    assert client.get(f"/api/runs/{run_id}").json()["steps"][1]["waits_for"] == step["waits_for"]
    text = invoke("show", run_id).output
    assert f"step 1 waits for {step['waits_for']}" in text
    assert "attention" not in text
    listed = client.get("/api/runs", params={"status": "waiting"}).json()["runs"]
    assert [(r["run_id"], r["attention"]) for r in listed] == [(run_id, None)]


def test_a_sleep_and_a_callback_say_what_they_wait_for() -> None:
    sleeper, shipper = started("d-sleeper"), started("d-shipper")
    assert (
        api.reads()
        .run_detail(sleeper)
        .to_dict()["steps"][1]["waits_for"]
        .startswith("a sleep until ")
    )
    assert (
        api.reads()
        .run_detail(shipper)
        .to_dict()["steps"][1]["waits_for"]
        .startswith("a callback until ")
    )


def test_list_status_waiting_finds_the_waiting_runs() -> None:
    waiting = started("d-payer")
    api.ensure_agents()
    other = api.start_run("desk", "order 1")
    assert drive(other) is RunStatus.COMPLETED
    done = invoke("list", "--status", "waiting", "--json")
    assert done.exit_code == 0, done.output
    assert [r["run_id"] for r in json.loads(done.output)] == [waiting]


def test_a_parent_lists_its_children_and_a_child_names_its_parent(client: TestClient) -> None:
    parent = started("d-planner")
    child = f"{parent}:1"
    shown = json.loads(invoke("show", parent, "--json").output)
    assert shown["children"] == [{"run_id": child, "step": 1, "status": "pending"}]
    assert shown["steps"][1]["waits_for"] == f"child run {child}"
    assert client.get(f"/api/runs/{parent}").json()["children"] == shown["children"]
    header = client.get(f"/api/runs/{parent}", params={"steps": "false"}).json()
    assert header["children"] == shown["children"] and "steps" not in header
    of_child = client.get(f"/api/runs/{child}").json()
    assert of_child["parent"] == {"run_id": parent, "step": 1}
    text = invoke("show", parent).output
    assert f"child {child} (step 1): pending" in text
    assert f"child of {parent} (its step 1)" in invoke("show", child).output


def test_a_parent_whose_child_waits_on_an_approval_is_child_waiting(client: TestClient) -> None:
    parent = started("d-planner")
    child = f"{parent}:1"
    assert api.reads().needs(api.get_run(parent)) is None  # the child is working
    assert drive(child) is RunStatus.WAITING  # its first charge awaits approval
    found = api.reads().needs(api.get_run(parent))
    assert found is not None and found.code == "child_waiting"
    assert found.detail.startswith(
        f"child run {child}: step 1 (charge) waits for `harness approve`"
    )
    listed = client.get("/api/runs", params={"status": "waiting"}).json()["runs"]
    assert {r["run_id"]: r["attention"] for r in listed} == {
        parent: "child_waiting",
        child: "awaiting_approval",
    }
    shown = json.loads(invoke("show", parent, "--json").output)
    assert shown["attention"] == "child_waiting"
    assert "attention (child_waiting)" in invoke("show", parent).output


def test_stats_and_metrics_count_what_waits(client: TestClient) -> None:
    assert client.get("/api/stats").json()["oldest_wait_s"] is None
    payer = started("d-payer")
    started("d-planner")
    invoke("signal", payer, "unasked")
    stats = json.loads(invoke("stats", "--json").output)
    assert stats["deferred_steps"] == {"callback": 0, "signal": 1, "sleep": 0, "child": 1}
    assert (stats["signals_kept"], stats["children_started"], stats["wait_timeouts"]) == (1, 1, 0)
    assert stats["oldest_wait_run"] == payer and stats["oldest_wait_s"] >= 0
    assert client.get("/api/stats").json()["deferred_steps"] == stats["deferred_steps"]
    text = client.get("/metrics").text
    for line in (
        'harness_deferred_steps{kind="signal"} 1.0',
        'harness_deferred_steps{kind="child"} 1.0',
        "harness_signals_kept 1.0",
        "harness_children_started_total 1.0",
        "harness_wait_timeouts_total 0.0",
    ):
        assert line in text.splitlines(), line
    assert "harness_oldest_wait_age_seconds " in text
