"""Operator actions that race, on every backend (SQLite and PostgreSQL).

Each action is decided against what the store holds after its own write
lost, never by a read before it: of two creates of one run id, or two
different decisions on one call, exactly one wins and the other is told
what won (RunConflict, DecisionConflict); the same decision twice is a
no-op that says so. Threads race here through the public Python API on one
store, as two operators (or two HTTP requests) would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import harness
from harness import api
from harness.engine import transitions
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.errors import DecisionConflict, RunConflict
from harness.records import RunStatus, StepStatus

PAIRS = 12


@harness.tool(effect="idempotent", requires_approval=True)
def grant(amount: int) -> dict[str, int]:
    """Grant an amount: an operator approves each call first."""
    return {"granted": amount}


GRANTS = [
    {
        "tool_calls": [
            {"name": "grant", "args": {"amount": 10}},
            {"name": "grant", "args": {"amount": 20}},
        ]
    },
    {"final": "granted"},
]
harness.register_agent(
    harness.Agent(name="op-race", model=harness.ScriptedModel(GRANTS), tools=[grant])
)
harness.register_agent(
    harness.Agent(name="op-race-other", model=harness.ScriptedModel(GRANTS), tools=[grant])
)
harness.register_agent(
    harness.Agent(name="op-answer", model=harness.ScriptedModel([{"final": "done"}]))
)


@pytest.fixture(autouse=True)
def _store(monkeypatch: pytest.MonkeyPatch, database_url: str, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", database_url)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    api.reset_runtime()
    yield
    api.reset_runtime()


def race(*actions: Callable[[], Any]) -> list[Any]:
    """Run ``actions`` in threads released at once; each one's return value,
    or the exception it raised."""
    gate = threading.Barrier(len(actions))
    results: list[Any] = [None] * len(actions)

    def go(i: int, action: Callable[[], Any]) -> None:
        gate.wait()
        try:
            results[i] = action()
        except Exception as err:  # the loser's answer, compared below
            results[i] = err

    threads = [threading.Thread(target=go, args=(i, a)) for i, a in enumerate(actions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def waiting_run(run_id: str) -> str:
    """A run of op-race waiting on the approval of its first grant (step 1)."""
    harness.start_run("op-race", "grant twice", run_id=run_id)
    assert drive(run_id) is TaskResult.WAITING
    return run_id


def drive(run_id: str) -> TaskResult:
    outcome = TaskResult.ADVANCED
    for _ in range(10):
        outcome = run_step(api.runtime(), run_id)
        if outcome is not TaskResult.ADVANCED:
            break
    return outcome


# One run id, one agent and goal --------------------------------------------------


def test_racing_creates_of_one_id_with_two_goals_have_one_winner() -> None:
    for i in range(PAIRS):
        run_id = f"create-{i}"
        results = race(
            partial(harness.start_run, "op-race", "goal A", run_id=run_id),
            partial(harness.start_run, "op-race", "goal B", run_id=run_id),
        )
        won = [r for r in results if r == run_id]
        lost = [r for r in results if isinstance(r, RunConflict)]
        assert (len(won), len(lost)) == (1, 1), results
        goal = "goal A" if results[0] == run_id else "goal B"
        assert api.get_run(run_id).goal == goal
        assert f"run {run_id} exists" in str(lost[0]) and goal in str(lost[0])


def test_racing_creates_with_the_same_goal_create_one_run() -> None:
    for i in range(PAIRS):
        run_id = f"same-{i}"
        results = race(
            partial(api.start, "op-race", "goal A", run_id=run_id),
            partial(api.start, "op-race", "goal A", run_id=run_id),
        )
        assert sorted(r.created for r in results) == [False, True], results
        assert {r.run_id for r in results} == {run_id}
    assert len(api.reads().store.events("same-0")) == 1  # one creation event


def test_the_same_id_with_another_agent_is_a_conflict_and_the_run_untouched() -> None:
    harness.start_run("op-race", "goal", run_id="taken")
    with pytest.raises(RunConflict, match="agent op-race"):
        harness.start_run("op-race-other", "goal", run_id="taken")
    assert harness.start_run("op-race", "goal", run_id="taken") == "taken"
    run = api.get_run("taken")
    assert (run.agent, run.goal, run.version) == ("op-race", "goal", 1)


def test_a_fork_to_a_taken_id_with_another_goal_or_agent_is_a_conflict() -> None:
    harness.start_run("op-race", "the goal", run_id="origin")
    assert harness.fork_run("origin", 0, goal="fork goal", new_run_id="f") == "f"
    assert harness.fork_run("origin", 0, goal="fork goal", new_run_id="f") == "f"
    with pytest.raises(RunConflict, match="goal"):
        harness.fork_run("origin", 0, goal="another goal", new_run_id="f")
    with pytest.raises(RunConflict, match="agent"):
        harness.fork_run("origin", 0, goal="fork goal", agent="op-race-other", new_run_id="f")
    fork = api.get_run("f")
    assert (fork.agent, fork.goal) == ("op-race", "fork goal")


# Approve and reject ----------------------------------------------------------------


def test_racing_approvals_with_other_arguments_have_one_winner() -> None:
    for i in range(PAIRS):
        run_id = waiting_run(f"args-{i}")
        results = race(
            partial(harness.approve, run_id, args={"amount": 11}, by="alice"),
            partial(harness.approve, run_id, args={"amount": 12}, by="bob"),
        )
        lost = [r for r in results if isinstance(r, DecisionConflict)]
        assert len(lost) == 1, results
        winner = ("alice", 11) if lost[0] is results[1] else ("bob", 12)
        step = api.get_steps(run_id)[1]
        assert step.approval is not None and step.approval.by == winner[0]
        assert step.args == {"amount": winner[1]}
        assert f"step 1 was already approved by {winner[0]}" in str(lost[0])
        assert "nothing changed" in str(lost[0])
        assert lost[0].run.run_id == run_id
        drive(run_id)
        assert api.get_steps(run_id)[1].result == {"granted": winner[1]}


def test_racing_approve_and_reject_have_one_winner() -> None:
    for i in range(PAIRS):
        run_id = waiting_run(f"word-{i}")
        results = race(
            partial(harness.approve, run_id, by="alice"),
            partial(harness.reject, run_id, "not this one", by="bob"),
        )
        lost = [r for r in results if isinstance(r, DecisionConflict)]
        assert len(lost) == 1, results
        approved = lost[0] is results[1]
        drive(run_id)
        step = api.get_steps(run_id)[1]
        if approved:
            assert (step.status, step.result) == (StepStatus.DONE, {"granted": 10})
            assert "already approved by alice" in str(lost[0])
        else:
            assert (step.status, step.error) == (StepStatus.FAILED, "rejected by bob: not this one")
            assert "already rejected by bob" in str(lost[0])


def test_racing_words_given_ahead_have_one_winner() -> None:
    """Words on a later call of the batch, noted beside the version."""
    for i in range(PAIRS):
        run_id = waiting_run(f"ahead-{i}")
        results = race(
            partial(harness.approve, run_id, step=2, args={"amount": 21}, by="alice"),
            partial(harness.reject, run_id, "no", step=2, by="bob"),
        )
        lost = [r for r in results if isinstance(r, DecisionConflict)]
        assert len(lost) == 1, results
        word = api.get_steps(run_id)[2].approval
        assert word is not None
        assert word.by == ("alice" if lost[0] is results[1] else "bob")


def test_a_decision_lost_to_another_is_a_conflict_and_the_same_one_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deterministic: the other decision lands between this one's read and
    its write, so this one's compare-and-swap loses."""
    run_id = waiting_run("lost")
    build = transitions.decide

    def other_first(*args: Any, **kwargs: Any) -> Any:
        checkpoint = build(*args, **kwargs)
        monkeypatch.setattr(transitions, "decide", build)
        harness.reject(run_id, "too much", by="bob")
        return checkpoint

    monkeypatch.setattr(transitions, "decide", other_first)
    with pytest.raises(DecisionConflict) as lost:
        harness.approve(run_id, by="alice")
    assert str(lost.value) == (
        f"run {run_id} is running: step 1 was already rejected by bob (too much); nothing changed"
    )
    again = api.Operator("carol").reject(run_id, "too much")
    assert (again.changed, again.said) == (False, "step 1 was already rejected by bob (too much)")
    with pytest.raises(DecisionConflict, match="rejected by bob"):
        harness.reject(run_id, "another reason")


def test_the_same_approval_twice_is_a_no_op_and_other_arguments_a_conflict() -> None:
    run_id = waiting_run("twice")
    first = api.Operator("alice").approve(run_id, args={"amount": 15})
    assert first.changed
    again = api.Operator("bob").approve(run_id, step=1, args={"amount": 15})
    assert (again.changed, again.run.version) == (False, first.run.version)
    assert again.said == 'step 1 was already approved by alice with {"amount": 15}'
    # No --step: the call the run just moved on with.
    assert not api.Operator("bob").approve(run_id, args={"amount": 15}).changed
    with pytest.raises(DecisionConflict, match=r'approved by alice with \{"amount": 15\}'):
        harness.approve(run_id, step=1)  # the proposed arguments: not what was approved
    with pytest.raises(DecisionConflict, match="approved by alice"):
        harness.reject(run_id, "no", step=1)


# Cancel, pause, resume -------------------------------------------------------------


def test_a_cancel_racing_completion_has_one_winner() -> None:
    for i in range(PAIRS):
        run_id = harness.start_run("op-answer", "answer", run_id=f"end-{i}")
        rt = api.runtime()
        results = race(partial(run_step, rt, run_id), partial(harness.cancel_run, run_id))
        assert isinstance(results[0], TaskResult), results  # the step's write lost, or won
        status = api.get_run(run_id).status
        assert status in (RunStatus.COMPLETED, RunStatus.CANCELLED)
        if status is RunStatus.COMPLETED:
            assert isinstance(results[1], DecisionConflict), results
            assert str(results[1]) == f"run {run_id} has completed; nothing changed"
        else:
            assert results[1].status is RunStatus.CANCELLED, results


def test_a_cancel_that_lost_to_completion_is_a_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = harness.start_run("op-answer", "answer", run_id="late")
    build = transitions.cancel

    def completed_first(*args: Any, **kwargs: Any) -> Any:
        checkpoint = build(*args, **kwargs)
        monkeypatch.setattr(transitions, "cancel", build)
        assert run_step(api.runtime(), run_id) is TaskResult.COMPLETED
        return checkpoint

    monkeypatch.setattr(transitions, "cancel", completed_first)
    with pytest.raises(DecisionConflict, match="has completed; nothing changed"):
        harness.cancel_run(run_id)
    assert api.get_run(run_id).status is RunStatus.COMPLETED


def test_a_cancel_of_a_cancelled_run_is_a_no_op() -> None:
    run_id = harness.start_run("op-answer", "answer", run_id="gone")
    assert api.Operator().cancel(run_id, "first").changed
    again = api.Operator().cancel(run_id, "second")
    assert (again.changed, again.said) == (False, "already cancelled: first")
    assert api.get_run(run_id).error == "first"


def test_pause_and_resume_repeat_as_no_ops_and_refuse_an_ended_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = harness.start_run("op-answer", "answer", run_id="hold")
    assert api.Operator("dave").pause(run_id).changed
    again = api.Operator("erin").pause(run_id)
    assert (again.changed, again.said) == (False, "a pause was already asked for")
    assert api.Operator("dave").resume(run_id).changed  # the pause withdrawn
    again = api.Operator("dave").resume(run_id)
    assert (again.changed, again.said) == (False, "not paused: nothing to resume")
    with pytest.raises(DecisionConflict, match="not paused"):
        harness.resume_run(run_id, max_tokens=1000)  # a budget it would not get

    # A pause whose note lost to the run's end (the note matched no row).
    ask = api.runtime().store.request_pause

    def ended_first(*args: Any, **kwargs: Any) -> bool:
        harness.cancel_run(run_id)
        return ask(*args, **kwargs)

    monkeypatch.setattr(api.runtime().store, "request_pause", ended_first)
    with pytest.raises(DecisionConflict, match=f"run {run_id} has been cancelled"):
        harness.pause_run(run_id)
