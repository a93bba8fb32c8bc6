"""Forks, driven in-process on SQLite: which steps a fork copies, which it runs.

A fork reuses the recorded steps before its fork point and executes only the
steps from it on, under its own idempotency keys; the original is only read.
Tool calls are counted by key in ``called``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness
from harness import api
from harness.cli import main
from harness.engine import transitions
from harness.engine.creation import create_run
from harness.errors import AgentNotFound, BadForkPoint, RunConflict
from harness.models import ModelRequest, ModelTurn
from harness.records import ForkOrigin, Run, RunStatus, Step, StepKind, StepStatus
from harness.runs.fork import check_fork_point, fork_points, fork_run
from harness.store import RunQuery, ToolRecord
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.rig import Rig

called: list[str] = []


@harness.tool(effect="idempotent")
def fork_bump(n: int, ctx: harness.ToolContext) -> dict[str, Any]:
    called.append(ctx.idempotency_key)
    return {"n": n}


def _turns(count: int) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "fork_bump", "args": {"n": i}}]} for i in range(count)
    ]
    return [*calls, {"final": f"{count} bumps"}]


class Recalls:
    """A model that answers at once, saying what the conversation so far held:
    the goal and the tool results it was shown."""

    records_responses = False

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        seen = [s.result for s in request.history() if s.kind is StepKind.TOOL]
        return ModelTurn(final=f"{request.goal}: saw {seen}")


CHAIN = "u-fork-chain"
harness.register_agent(
    harness.Agent(name=CHAIN, model=harness.ScriptedModel(_turns(3)), tools=[fork_bump])
)
harness.register_agent(harness.Agent(name="u-fork-recalls", model=Recalls(), tools=[fork_bump]))


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    called.clear()
    yield Rig(memory_store)


def completed_chain(rig: Rig) -> Run:
    run_id = create_run(rig.runtime(), CHAIN, "bump three times")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED and run.cursor == 7
    called.clear()
    return run


def snapshot(rig: Rig, run_id: str) -> tuple[Any, ...]:
    """Everything stored about a run, to show it did not change."""
    store = rig.store
    steps = [s.to_dict() for s in store.steps(run_id)]
    events = [e.to_dict() for e in store.events(run_id)]
    records = store.tool_records([f"{run_id}:{i}" for i in range(len(steps))])
    return store.load(run_id).to_dict(), steps, events, records


# -- where a fork can start ------------------------------------------------------


def test_fork_points_are_the_model_turns_after_settled_steps(rig: Rig) -> None:
    run = completed_chain(rig)
    steps = rig.store.steps(run.run_id)
    assert fork_points(steps) == [0, 2, 4, 6]
    running = [replace(s, status=StepStatus.RUNNING) if s.index == 3 else s for s in steps]
    # Model step 4 exists, but the call before it has not settled.
    assert fork_points(running) == [0, 2]


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (3, "step 3 is a tool step: a fork starts at a model turn: 0, 2, 4, 6"),
        (7, "has no step 7 recorded (steps 0 to 6): a fork starts at a model turn: 0, 2, 4, 6"),
    ],
)
def test_another_step_says_which_boundaries_exist(rig: Rig, at: int, message: str) -> None:
    run = completed_chain(rig)
    with pytest.raises(BadForkPoint) as raised:
        fork_run(rig.runtime(), run.run_id, at)
    assert message in str(raised.value)
    assert raised.value.boundaries == [0, 2, 4, 6]
    assert rig.store.query_runs(RunQuery(limit=10, forked_from=run.run_id)) == []


def test_a_fork_copies_only_settled_steps(rig: Rig) -> None:
    run = completed_chain(rig)
    steps = rig.store.steps(run.run_id)
    pending = [replace(s, status=StepStatus.IN_DOUBT) if s.index == 3 else s for s in steps]
    with pytest.raises(BadForkPoint, match=r"step 3 before it is in_doubt.*turn: 0, 2$"):
        check_fork_point(run, pending, 4)


# -- what a fork copies and what it runs ------------------------------------------


def test_a_fork_never_executes_a_step_before_its_fork_point(rig: Rig) -> None:
    original = completed_chain(rig)
    before = snapshot(rig, original.run_id)
    fork_id = fork_run(rig.runtime(), original.run_id, 2)
    fork = rig.load(fork_id)
    assert (fork.status, fork.cursor, fork.version, fork.step_count) == (
        RunStatus.PENDING,
        2,
        1,
        3,
    )
    assert fork.forked_from == ForkOrigin(original.run_id, 2)
    assert rig.sent == [(fork_id, 2)]
    rig.drive()
    fork = rig.load(fork_id)
    assert fork.status is RunStatus.COMPLETED and fork.result == "3 bumps"
    # Only the calls from the fork point on ran, each once, under the fork's keys.
    assert called == [f"{fork_id}:3", f"{fork_id}:5"]
    steps = rig.store.steps(fork_id)
    originals = rig.store.steps(original.run_id)
    for copied, source in zip(steps[:2], originals[:2], strict=True):
        assert replace(copied, run_id=source.run_id) == source
    assert rig.store.get_tool_result(f"{fork_id}:1") == (True, {"n": 0})
    assert snapshot(rig, original.run_id) == before
    (created, *_) = rig.store.events(fork_id)
    assert created.to_status == "pending"
    assert created.detail == f"forked from {original.run_id} at step 2; agent={CHAIN}"
    assert fork.to_dict()["forked_from"] == {"run_id": original.run_id, "step": 2}
    assert original.to_dict()["forked_from"] is None


def test_a_fork_at_step_zero_starts_afresh_with_a_new_goal(rig: Rig) -> None:
    original = completed_chain(rig)
    fork_id = fork_run(rig.runtime(), original.run_id, 0, goal="bump again")
    rig.drive()
    fork = rig.load(fork_id)
    assert (fork.goal, fork.status) == ("bump again", RunStatus.COMPLETED)
    assert called == [f"{fork_id}:1", f"{fork_id}:3", f"{fork_id}:5"]
    assert rig.store.events(fork_id)[0].detail.endswith("; new goal")  # type: ignore[union-attr]


def test_another_agent_sees_the_copied_steps_as_its_history(rig: Rig) -> None:
    original = completed_chain(rig)
    fork_id = fork_run(rig.runtime(), original.run_id, 4, agent="u-fork-recalls", goal="recall")
    rig.drive()
    fork = rig.load(fork_id)
    assert fork.agent == "u-fork-recalls"
    assert fork.result == "recall: saw [{'n': 0}, {'n': 1}]"
    assert called == []
    with pytest.raises(AgentNotFound, match="no agent named 'nobody'"):
        fork_run(rig.runtime(), original.run_id, 4, agent="nobody")


def test_a_run_still_moving_forks_at_its_current_turn(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), CHAIN, "bump three times")
    rig.drive(limit=2)  # model step 0 and the call at step 1
    rig.sent.clear()  # the original's next message is held back: it stays at step 2
    moving = rig.load(run_id)
    assert (moving.status, moving.cursor) == (RunStatus.RUNNING, 2)
    with pytest.raises(BadForkPoint, match="no step 4 recorded"):
        fork_run(rig.runtime(), run_id, 4)
    fork_id = fork_run(rig.runtime(), run_id, 2)
    rig.drive()
    assert rig.load(fork_id).status is RunStatus.COMPLETED
    assert rig.load(run_id) == moving
    assert called == [f"{run_id}:1", f"{fork_id}:3", f"{fork_id}:5"]


def test_an_explicit_id_makes_forking_idempotent(rig: Rig) -> None:
    original = completed_chain(rig)
    first = fork_run(rig.runtime(), original.run_id, 2, new_run_id="the-fork")
    again = fork_run(rig.runtime(), original.run_id, 2, new_run_id="the-fork")
    assert first == again == "the-fork"
    with pytest.raises(RunConflict, match="goal 'bump three times', forked from"):
        fork_run(rig.runtime(), original.run_id, 2, new_run_id="the-fork", goal="other")
    assert rig.sent == [("the-fork", 2)]  # dispatched once
    assert rig.load("the-fork").forked_from == ForkOrigin(original.run_id, 2)
    assert len(rig.store.events("the-fork")) == 1


def test_an_explicit_id_of_another_run_is_refused(rig: Rig) -> None:
    original = completed_chain(rig)
    fork_run(rig.runtime(), original.run_id, 2, new_run_id="the-fork")
    before = snapshot(rig, original.run_id), snapshot(rig, "the-fork")
    forked = f", forked from {original.run_id} at step 2"
    for taken, at, origin in ((original.run_id, 2, ""), ("the-fork", 4, forked)):
        message = f"run {taken} exists with agent {CHAIN} and goal 'bump three times'{origin}: "
        with pytest.raises(RunConflict, match=message + "another run, not created$"):
            fork_run(rig.runtime(), original.run_id, at, new_run_id=taken)
    assert (snapshot(rig, original.run_id), snapshot(rig, "the-fork")) == before
    assert rig.sent == [("the-fork", 2)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at", "-1"], "has no step -1 recorded (steps 0 to 6): a fork starts at a model turn"),
        (["--at", "2", "--goal", " "], "the goal must not be empty"),
        (["--at", "2", "--run-id", "ORIGIN", "--json"], "run ORIGIN exists with agent"),
    ],
)
def test_the_command_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], message: str
) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", f"sqlite:///{tmp_path / 'f.db'}")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    api.reset_runtime()
    try:
        run_id = completed_chain(Rig(api.runtime().store)).run_id
        args = [a.replace("ORIGIN", run_id) for a in args]
        result = CliRunner().invoke(main, ["fork", run_id, *args])
    finally:
        api.reset_runtime()
    assert result.exit_code != 0 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message.replace("ORIGIN", run_id) in result.stderr
    assert api_runs(tmp_path) == 1  # nothing forked


def api_runs(tmp_path: Path) -> int:
    store = SQLStore.from_url(f"sqlite:///{tmp_path / 'f.db'}")
    try:
        return len(store.query_runs(RunQuery(limit=10)))
    finally:
        store.close()


def test_forks_of_forks_are_listed_under_their_parent(rig: Rig) -> None:
    original = completed_chain(rig)
    child = fork_run(rig.runtime(), original.run_id, 2)
    rig.drive()
    grandchild = fork_run(rig.runtime(), child, 4)
    sibling = fork_run(rig.runtime(), original.run_id, 6)
    rig.drive()

    def children(run_id: str) -> set[str]:
        return {r.run_id for r in rig.store.query_runs(RunQuery(limit=10, forked_from=run_id))}

    assert children(original.run_id) == {child, sibling}
    assert children(child) == {grandchild}
    assert children(grandchild) == set()
    # The grandchild's past is the child's: the call at step 1 was the original's.
    assert rig.store.get_tool_result(f"{grandchild}:1") == (True, {"n": 0})
    assert rig.store.get_tool_result(f"{grandchild}:3") == (True, {"n": 1})


# -- the transition ---------------------------------------------------------------


def test_the_transition_carries_usage_and_budgets_of_the_copied_past() -> None:
    origin = Run("o", "a", "g", RunStatus.COMPLETED, 5, 9, 5, max_tokens=500, max_cost_usd=2.0)
    usage = {"input_tokens": 10, "output_tokens": 3}
    model = {"tool_calls": [], "usage": usage, "cost_usd": 0.25}
    steps = [
        Step("o", 0, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 0}, result=model),
        Step("o", 1, StepKind.TOOL, StepStatus.DONE, 1, tool="t", result=1),
        Step("o", 2, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 1}, result=model),
        Step("o", 3, StepKind.TOOL, StepStatus.FAILED, 2, tool="t", error="no"),
        Step("o", 4, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 2}, result=model),
    ]
    records = [ToolRecord("o:1", 1, "t", 1), ToolRecord("o:4", 4, "model", model)]
    made = transitions.fork(origin, steps, records, 4, run_id="f", agent="a", goal="g", now=5.0)
    assert (made.run.input_tokens, made.run.output_tokens, made.run.cost_usd) == (20, 6, 0.5)
    assert (made.run.max_tokens, made.run.max_cost_usd) == (500, 2.0)
    assert made.records == (ToolRecord("f:1", 1, "t", 1),)  # not the fork point's own
    assert made.steps[3] == replace(steps[3], run_id="f")
    assert made.steps[4] == Step("f", 4, StepKind.MODEL, StepStatus.PENDING, args={"turn": 2})
    other = transitions.fork(origin, steps, records, 4, run_id="f", agent="b", goal="g", now=5.0)
    assert (other.run.max_tokens, other.run.max_cost_usd) == (None, None)
