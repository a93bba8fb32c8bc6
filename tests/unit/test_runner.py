"""The step lifecycle, driven in-process on SQLite with a hand-moved clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

import harness
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.operations import cancel
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.models import ModelRequest, ModelTurn
from harness.records import RunStatus, StepKind, StepStatus
from harness.store import Checkpoint
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.rig import Rig

CALLS: list[tuple[str, dict[str, Any]]] = []


class Crash(BaseException):
    """Stands in for the process dying: nothing after it runs."""


@harness.tool(effect="idempotent")
def bump(n: int, ctx: harness.ToolContext) -> dict[str, int]:
    CALLS.append((ctx.idempotency_key, {"n": n, "attempt": ctx.attempt}))
    return {"n": n}


@harness.tool(effect="idempotent")
def dies_mid_call(ctx: harness.ToolContext) -> str:
    CALLS.append((ctx.idempotency_key, {}))
    if ctx.attempt == 1:
        raise Crash  # the effect happened, the result was never stored
    return "second time lucky"


@harness.tool(effect="at_most_once")
def charge(ctx: harness.ToolContext) -> str:
    CALLS.append((ctx.idempotency_key, {}))
    raise Crash


@harness.tool(effect="read_only")
def broken(kind: str) -> Any:
    if kind == "raise":
        raise ValueError("upstream said no")
    return {1, 2}  # not JSON


def _agent(name: str, turns: list[dict[str, Any]], tools: list[Any], **kw: Any) -> str:
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=tools, **kw)
    )
    return name


def _calls(*names_args: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "args": a} for n, a in names_args]}


TWO_BUMPS = _agent(
    "u-two-bumps", [_calls(("bump", {"n": 1}), ("bump", {"n": 2})), {"final": "done"}], [bump]
)


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLS.clear()
    yield Rig(memory_store)


def test_run_completes_with_every_step_checkpointed(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), TWO_BUMPS, "count to two")
    outcomes = rig.drive()
    assert outcomes == [TaskResult.ADVANCED] * 3 + [TaskResult.COMPLETED]
    run = rig.load(run_id)
    assert (run.status, run.result, run.owner) == (RunStatus.COMPLETED, "done", None)
    steps = rig.store.steps(run_id)
    assert [(s.index, s.kind, s.status, s.attempts) for s in steps] == [
        (0, StepKind.MODEL, StepStatus.DONE, 1),
        (1, StepKind.TOOL, StepStatus.DONE, 1),
        (2, StepKind.TOOL, StepStatus.DONE, 1),
        (3, StepKind.MODEL, StepStatus.DONE, 1),
    ]
    assert steps[1].result == {"n": 1}
    assert [key for key, _ in CALLS] == [f"{run_id}:1", f"{run_id}:2"]
    events = rig.store.events(run_id)
    assert [e.version for e in events] == sorted(e.version for e in events)
    assert events[-1].to_status == "completed"
    # each step: one "about to execute" and one result transition
    assert [e.to_status for e in events if e.step_index == 1] == ["running", "done"]


def test_stale_and_duplicate_messages_do_not_fork_the_chain(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    rig.drive(limit=1)  # step 0 done, message for cursor 1 queued
    assert rig.sent == [(run_id, 1)]
    # a user re-dispatches a run that is already moving
    assert run_step(rig.runtime(), run_id) is TaskResult.ADVANCED
    # the original message is now stale: dropped, not executed
    assert rig.drive(limit=1) == [TaskResult.STALE]
    assert run_step(rig.runtime(), run_id, cursor=0) is TaskResult.STALE
    rig.drive()
    assert len(CALLS) == 2
    assert rig.load(run_id).status is RunStatus.COMPLETED


def test_live_lease_keeps_others_out_until_it_expires(rig: Rig) -> None:
    run_id = create_run(
        rig.runtime(),
        _agent("u-crash", [_calls(("dies_mid_call", {})), {"final": "ok"}], [dies_mid_call]),
        "g",
    )
    rig.drive(limit=1)
    with pytest.raises(Crash):
        rig.drive(worker="w1", limit=1)
    running = rig.load(run_id)
    assert running.current is not None and running.current.status is StepStatus.RUNNING
    assert running.owner is not None and running.owner.startswith("w1/")
    assert run_step(rig.runtime("w2"), run_id) is TaskResult.LEASED
    rig.clock.advance(rig.lease_ttl + 1)
    assert run_step(rig.runtime("w2"), run_id) is TaskResult.ADVANCED
    kinds = [e.to_status for e in rig.store.events(run_id)]
    assert "lease_takeover" in kinds and "recovered_running" in kinds
    rig.drive(worker="w2")
    steps = rig.store.steps(run_id)
    assert steps[1].attempts == 2 and steps[1].result == "second time lucky"
    # re-invoked with the same key: the tool could dedupe downstream on it
    assert [key for key, _ in CALLS] == [f"{run_id}:1", f"{run_id}:1"]


class CrashBeforeResult:
    """A store that dies right before recording the result of one step."""

    def __init__(self, store: SQLStore, index: int) -> None:
        self.store = store
        self.index = index
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, cp: Checkpoint) -> int:
        if self.armed and any(
            p.index == self.index and p.status is StepStatus.DONE for p in cp.steps
        ):
            self.armed = False
            raise Crash
        return self.store.checkpoint(cp)


def _crash_before_result_then_recover(rig: Rig, run_id: str, worker: str) -> None:
    rig.store = CrashBeforeResult(rig.store, index=1)  # type: ignore[assignment]
    with pytest.raises(Crash):
        rig.drive(worker=worker, limit=1)
    rig.store = rig.store.store  # type: ignore[attr-defined]
    rig.clock.advance(rig.lease_ttl + 1)
    sent = recovery.sweep(rig.runtime("sweeper"))
    assert [(s.run_id, s.cursor) for s in sent] == [(run_id, 1)]


def test_a_result_whose_checkpoint_raised_is_kept_and_adopted(rig: Rig) -> None:
    """A result goes into its step's result checkpoint. If that write raises
    (the store failing for longer than the lease, a time limit), the result in
    hand is kept on the way out, so the next attempt adopts it instead of
    calling the tool again. (A SIGKILL there keeps nothing: the chaos suite
    counts that window with real kills.)"""
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    rig.drive(limit=1)
    _crash_before_result_then_recover(rig, run_id, "w1")
    assert rig.store.get_tool_result(f"{run_id}:1") == (True, {"n": 1})
    rig.drive(worker="w2")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert [key for key, _ in CALLS] == [f"{run_id}:1", f"{run_id}:2"]
    first = rig.store.steps(run_id)[1]
    assert (first.result, first.attempts) == ({"n": 1}, 2)


def test_at_most_once_step_in_doubt_is_never_re_invoked(rig: Rig) -> None:
    run_id = create_run(
        rig.runtime(), _agent("u-charge", [_calls(("charge", {})), {"final": "x"}], [charge]), "g"
    )
    rig.drive(limit=1)
    with pytest.raises(Crash):
        rig.drive(limit=1)
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive(worker="w2") == [TaskResult.WAITING]
    run = rig.load(run_id)
    assert run.status is RunStatus.WAITING and "at_most_once" in (run.error or "")
    assert rig.store.steps(run_id)[1].status is StepStatus.IN_DOUBT
    assert len(CALLS) == 1
    rig.clock.advance(rig.lease_ttl + 1)
    assert recovery.sweep(rig.runtime("sweeper")) == []  # waiting runs are left alone


def test_max_steps_fails_the_run_with_the_reason(rig: Rig) -> None:
    loop = [_calls(("bump", {"n": i})) for i in range(10)]
    run_id = create_run(rig.runtime(), _agent("u-loop", loop, [bump], max_steps=4), "g")
    outcomes = rig.drive()
    assert outcomes[-1] is TaskResult.FAILED
    run = rig.load(run_id)
    assert run.status is RunStatus.FAILED and run.error == "exceeded max_steps=4"
    assert len(CALLS) == 2  # steps 0..3 ran; step 4 was refused


@dataclass(frozen=True)
class BadCall:
    args: dict[str, Any]
    error: str


@pytest.mark.parametrize(
    "bad",
    [
        BadCall({"name": "nope", "args": {}}, "unknown tool 'nope'; agent 'u-bad-"),
        BadCall({"name": "bump", "args": {"n": "many"}}, "invalid arguments for tool 'bump': n:"),
        BadCall(
            {"name": "broken", "args": {"kind": "raise"}},
            "tool 'broken' raised ValueError: upstream said no",
        ),
        BadCall({"name": "broken", "args": {"kind": "set"}}, "not JSON-serialisable"),
    ],
    ids=["unknown", "invalid-args", "raises", "non-json"],
)
@pytest.mark.parametrize("policy", ["continue", "fail"])
def test_tool_errors_are_recorded_and_never_loop(rig: Rig, bad: BadCall, policy: str) -> None:
    name = _agent(
        f"u-bad-{policy}",
        [{"tool_calls": [bad.args]}, {"final": "gave up"}],
        [bump, broken],
        on_tool_error=policy,
    )
    run_id = create_run(rig.runtime(), name, "g")
    rig.drive()
    step = rig.store.steps(run_id)[1]
    assert step.status is StepStatus.FAILED and bad.error in (step.error or "")
    assert CALLS == []
    run = rig.load(run_id)
    if policy == "continue":
        assert (run.status, run.result) == (RunStatus.COMPLETED, "gave up")
    else:
        assert run.status is RunStatus.FAILED and bad.error in (run.error or "")


def test_model_out_of_turns_fails_the_run(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), _agent("u-short", [_calls(("bump", {"n": 1}))], [bump]), "g")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.FAILED
    assert "model step 2 failed" in (run.error or "") and "1 turns" in (run.error or "")


def test_messages_for_missing_runs_or_agents_are_dropped(rig: Rig) -> None:
    assert run_step(rig.runtime(), "no-such-run") is TaskResult.NO_RUN
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    harness.agents._AGENTS.pop(TWO_BUMPS)
    try:
        assert run_step(rig.runtime(), run_id) is TaskResult.NO_AGENT
        assert rig.load(run_id).status is RunStatus.PENDING
    finally:
        _agent(
            TWO_BUMPS, [_calls(("bump", {"n": 1}), ("bump", {"n": 2})), {"final": "done"}], [bump]
        )


def test_lost_dispatch_is_recovered_by_the_sweeper_once_per_ttl(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    rig.sent.clear()  # the first message was lost
    assert recovery.sweep(rig.runtime("sweeper")) == []  # not due yet
    rig.clock.advance(rig.lease_ttl + 1)
    first = recovery.sweep(rig.runtime("sweeper"))
    assert [s.run_id for s in first] == [run_id] and "no step message" in first[0].reason
    assert recovery.sweep(rig.runtime("sweeper")) == []  # wake_at was pushed forward
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED


def test_broker_down_at_dispatch_loses_nothing(rig: Rig) -> None:
    rig.drop_dispatches = True
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    assert rig.sent == []
    rig.drop_dispatches = False
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED


def test_zombie_result_is_fenced_after_takeover(rig: Rig) -> None:
    """Worker A stalls past its lease inside a tool; B takes over; A's write fails."""
    outcomes: list[TaskResult] = []

    @harness.tool(effect="idempotent")
    def stalls(ctx: harness.ToolContext) -> str:
        CALLS.append((ctx.idempotency_key, {"attempt": ctx.attempt}))
        if ctx.attempt == 1:
            rig.clock.advance(rig.lease_ttl + 1)  # A's heartbeat never got to run
            outcomes.append(run_step(rig.runtime("B"), ctx.run_id))
        return f"attempt {ctx.attempt}"

    run_id = create_run(
        rig.runtime(), _agent("u-zombie", [_calls(("stalls", {})), {"final": "x"}], [stalls]), "g"
    )
    rig.drive(worker="A", limit=1)
    zombie = rig.drive(worker="A", limit=1)
    assert outcomes == [TaskResult.ADVANCED] and zombie == [TaskResult.LEASE_LOST]
    step = rig.store.steps(run_id)[1]
    assert (step.status, step.result, step.attempts) == (StepStatus.DONE, "attempt 2", 2)
    # the durable record keeps the first stored result; A's late put did not overwrite it
    assert rig.store.get_tool_result(f"{run_id}:1") == (True, "attempt 2")


def test_cancel_mid_step_discards_the_result(rig: Rig) -> None:
    @harness.tool(effect="idempotent")
    def cancels_itself(ctx: harness.ToolContext) -> str:
        cancel(rig.runtime("operator"), ctx.run_id, "stop")
        return "late"

    run_id = create_run(
        rig.runtime(),
        _agent("u-cancel", [_calls(("cancels_itself", {})), {"final": "x"}], [cancels_itself]),
        "g",
    )
    assert rig.drive() == [TaskResult.ADVANCED, TaskResult.CANCELLED]
    run = rig.load(run_id)
    assert (run.status, run.error) == (RunStatus.CANCELLED, "stop")
    assert run_step(rig.runtime(), run_id) is TaskResult.NOT_MOVABLE


def test_create_run_is_idempotent_on_an_explicit_id(rig: Rig) -> None:
    assert create_run(rig.runtime(), TWO_BUMPS, "g", run_id="fixed") == "fixed"
    assert create_run(rig.runtime(), TWO_BUMPS, "g", run_id="fixed") == "fixed"
    with pytest.raises(harness.RunConflict, match="run fixed exists with agent u-two-bumps"):
        create_run(rig.runtime(), TWO_BUMPS, "other", run_id="fixed")
    assert rig.sent == [("fixed", 0)]
    assert rig.load("fixed").goal == "g"
    with pytest.raises(harness.AgentNotFound):
        create_run(rig.runtime(), "nobody", "g")


class StoreDownAfterCall:
    """The database goes away as a tool returns, for ``outage`` seconds of the clock."""

    def __init__(self, rig: Rig, outage: float) -> None:
        self.store = rig.store
        self.clock = rig.clock
        self.outage = outage
        self.back_at = 0.0
        self.failures = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _down(self) -> None:
        if self.clock.now() < self.back_at:
            self.failures += 1
            self.clock.advance(5.0)
            raise harness.StoreError("database error: connection lost")

    def put_tool_result(self, *args: Any) -> Any:
        self._down()
        return self.store.put_tool_result(*args)

    def checkpoint(self, cp: Checkpoint) -> int:
        if not self.back_at and cp.tool_record is not None:  # a tool has just returned
            self.back_at = self.clock.now() + self.outage
        self._down()
        return self.store.checkpoint(cp)


def test_a_short_outage_is_ridden_out_without_calling_the_tool_again(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    rig.drive(limit=1)
    down = StoreDownAfterCall(rig, outage=12)
    rig.store = down  # type: ignore[assignment]
    rig.drive()
    assert down.failures == 3
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert len(CALLS) == 2  # one call per tool step


def test_store_failure_is_not_blamed_on_the_tool(rig: Rig) -> None:
    """An outage longer than the lease: the step is left RUNNING for recovery,
    never recorded as a tool failure."""
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    rig.drive(limit=1)
    real = rig.store
    rig.store = StoreDownAfterCall(rig, outage=rig.lease_ttl * 2)  # type: ignore[assignment]
    with pytest.raises(harness.StoreError):
        rig.drive(limit=1)
    step = real.steps(run_id)[1]
    assert step.status is StepStatus.RUNNING and step.error is None
    rig.store = real
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED


class CommitThenLoseConnection:
    """The result checkpoint commits, but its reply is lost: the caller sees an error."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, cp: Checkpoint) -> int:
        version = self.store.checkpoint(cp)
        if self.armed and any(p.status is StepStatus.DONE for p in cp.steps):
            self.armed = False
            raise harness.StoreError("database error: server closed the connection")
        return version


def test_a_checkpoint_that_committed_before_its_error_is_recognised(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), TWO_BUMPS, "g")
    rig.store = CommitThenLoseConnection(rig.store)  # type: ignore[assignment]
    assert rig.drive(limit=1) == [TaskResult.ADVANCED]  # not mistaken for a lost lease
    assert rig.sent == [(run_id, 1)]
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED


@harness.tool(effect="at_most_once")
def hangs(ctx: harness.ToolContext) -> str:
    CALLS.append((ctx.idempotency_key, {}))
    raise SoftTimeLimitExceeded()  # what Celery raises in the call, just before the kill


class _StoppedModel:
    """A model whose call the process stops (Celery's soft time limit)."""

    records_responses = False

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        raise SoftTimeLimitExceeded()


def test_a_soft_time_limit_interrupts_a_call_and_records_nothing(rig: Rig) -> None:
    run_id = create_run(
        rig.runtime(), _agent("u-hangs", [_calls(("hangs", {})), {"final": "x"}], [hangs]), "g"
    )
    rig.drive(limit=1)
    with pytest.raises(SoftTimeLimitExceeded):
        rig.drive(limit=1)
    assert rig.store.steps(run_id)[1].status is StepStatus.RUNNING  # not a failed call
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive(worker="w2") == [TaskResult.WAITING]  # the call may have happened
    assert rig.store.steps(run_id)[1].status is StepStatus.IN_DOUBT
    assert len(CALLS) == 1

    harness.register_agent(harness.Agent(name="u-stopped", model=_StoppedModel(), tools=[]))
    stopped = create_run(rig.runtime(), "u-stopped", "g")
    with pytest.raises(SoftTimeLimitExceeded):
        rig.drive(limit=1)
    model_step = rig.store.steps(stopped)[0]
    assert model_step.status is not StepStatus.FAILED and model_step.error is None
    assert rig.load(stopped).status is not RunStatus.FAILED
