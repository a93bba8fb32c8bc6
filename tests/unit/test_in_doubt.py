"""In-doubt side effects, operator decisions, budgets and lapsed leases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.executor import Claim, ClaimState, NoCache
from harness.engine.leases import Lease
from harness.engine.operations import Decision, resolve
from harness.engine.taskresult import TaskResult
from harness.errors import DecisionConflict, NotResolvable
from harness.records import RunStatus, StepStatus
from harness.store.memory import MemoryStore
from harness.tools import Happened, NotHappened
from tests.rig import Rig

calls: list[int] = []
verdicts: list[Any] = []


class Crash(BaseException):
    pass


def _reconcile(ctx: harness.ToolContext) -> Any:
    verdict = verdicts.pop(0)
    if isinstance(verdict, Exception):
        raise verdict
    return verdict


@harness.tool(effect="at_most_once", reconcile=_reconcile)
def wire_money(amount: int, ctx: harness.ToolContext) -> dict[str, int]:
    calls.append(ctx.attempt)
    if ctx.attempt == 1:
        raise Crash
    return {"wired": amount}


@harness.tool(effect="at_most_once")
def send_letter(ctx: harness.ToolContext) -> str:
    calls.append(ctx.attempt)
    if ctx.attempt == 1:
        raise Crash
    return "sent"


def _agent(name: str, tool: Any, **kw: Any) -> str:
    turns = [{"tool_calls": [{"name": tool.name, "args": kw.pop("args", {})}]}, {"final": "ok"}]
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=[tool], **kw)
    )
    return name


WIRE = _agent("d-wire", wire_money, args={"amount": 7})
LETTER = _agent("d-letter", send_letter)
LETTER_STRICT = _agent("d-letter-strict", send_letter, on_tool_error="fail")


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    calls.clear()
    verdicts.clear()
    yield Rig(memory_store)


def _crash_mid_call(rig: Rig, agent: str) -> str:
    """Start a run and kill its first tool call; then let the lease expire and sweep."""
    run_id = create_run(rig.runtime(), agent, "g")
    rig.drive(limit=1)
    with pytest.raises(Crash):
        rig.drive(limit=1)
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    return run_id


@pytest.mark.parametrize(
    ("verdict", "status", "result", "calls_after"),
    [
        (
            Happened({"wired": 7, "by": "reconcile"}),
            RunStatus.COMPLETED,
            {"wired": 7, "by": "reconcile"},
            [1],
        ),
        (NotHappened(), RunStatus.COMPLETED, {"wired": 7}, [1, 2]),
        (None, RunStatus.WAITING, None, [1]),
        (RuntimeError("bank API down"), RunStatus.WAITING, None, [1]),
    ],
    ids=["happened", "not-happened", "unknown", "reconcile-raises"],
)
def test_reconcile_decides_an_interrupted_at_most_once_call(
    rig: Rig, verdict: Any, status: RunStatus, result: Any, calls_after: list[int]
) -> None:
    run_id = _crash_mid_call(rig, WIRE)
    verdicts.append(verdict)
    rig.drive(worker="w2")
    run = rig.load(run_id)
    assert run.status is status
    step = rig.store.steps(run_id)[1]
    assert step.result == result
    assert calls == calls_after
    if status is RunStatus.WAITING:
        assert step.status is StepStatus.IN_DOUBT and "harness resolve" in (step.error or "")


def test_stored_result_of_an_at_most_once_call_is_used_not_doubted(rig: Rig) -> None:
    run_id = _crash_mid_call(rig, LETTER)
    rig.store.put_tool_result(f"{run_id}:1", run_id, 1, "send_letter", "sent", 0.0)
    rig.drive(worker="w2")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert calls == [1]


@pytest.mark.parametrize(
    ("decision", "result", "agent", "run_status", "step_status", "calls_after"),
    [
        # attempt 2 was the recovery that found it in doubt; the retry is attempt 3
        (Decision.RETRY, None, LETTER, RunStatus.COMPLETED, StepStatus.DONE, [1, 3]),
        (Decision.SUCCEEDED, "sent by hand", LETTER, RunStatus.COMPLETED, StepStatus.DONE, [1]),
        (Decision.FAIL, None, LETTER, RunStatus.COMPLETED, StepStatus.FAILED, [1]),
        (Decision.FAIL, None, LETTER_STRICT, RunStatus.FAILED, StepStatus.FAILED, [1]),
    ],
    ids=["retry", "succeeded", "fail-continue", "fail-strict"],
)
def test_operator_resolves_an_in_doubt_step(
    rig: Rig,
    decision: Decision,
    result: Any,
    agent: str,
    run_status: RunStatus,
    step_status: StepStatus,
    calls_after: list[int],
) -> None:
    run_id = _crash_mid_call(rig, agent)
    assert rig.drive(worker="w2") == [TaskResult.WAITING]
    resolve(rig.runtime("operator"), run_id, decision, result, force=True)
    rig.drive(worker="w2")
    run = rig.load(run_id)
    step = rig.store.steps(run_id)[1]
    assert (run.status, step.status) == (run_status, step_status)
    assert calls == calls_after
    if decision is Decision.SUCCEEDED:
        assert step.result == result
        assert rig.store.get_tool_result(f"{run_id}:1") == (True, result)
    resolved = [e for e in rig.store.events(run_id) if e.detail == f"operator: {decision}"]
    assert resolved and all(e.worker == "operator" for e in resolved)


def test_only_an_in_doubt_step_can_be_resolved(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), LETTER, "g")
    with pytest.raises(NotResolvable, match="pending, with no step in doubt"):
        resolve(rig.runtime("operator"), run_id, Decision.RETRY)


def test_a_step_that_keeps_killing_workers_fails_the_run(rig: Rig) -> None:
    @harness.tool(effect="idempotent")
    def oom(ctx: harness.ToolContext) -> None:
        calls.append(ctx.attempt)
        raise Crash

    name = _agent("d-oom", oom, max_attempts=3)
    run_id = create_run(rig.runtime(), name, "g")
    rig.drive(limit=1)
    for _ in range(3):
        with pytest.raises(Crash):
            rig.drive(limit=1)
        rig.clock.advance(rig.lease_ttl + 1)
        recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive() == [TaskResult.FAILED]
    run = rig.load(run_id)
    assert run.status is RunStatus.FAILED and "interrupted 3 times" in (run.error or "")
    assert calls == [1, 2, 3]


def test_a_run_past_its_deadline_fails(rig: Rig) -> None:
    name = _agent("d-deadline", send_letter, deadline=60)
    run_id = create_run(rig.runtime(), name, "g")
    rig.clock.advance(61)
    assert rig.drive() == [TaskResult.FAILED]
    assert "deadline of 60s" in (rig.load(run_id).error or "")


class SlowClaim(NoCache):
    """Redis answers so late that our lease lapsed meanwhile."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    def claim(self, key: str, owner: str, ttl: float) -> Claim:
        self.rig.clock.advance(self.rig.lease_ttl + 1)
        return Claim(ClaimState.ACQUIRED)


def test_a_lapsed_lease_stops_the_call_before_it_happens(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), LETTER, "g")
    rig.drive(limit=1)
    rig.cache = SlowClaim(rig)
    assert rig.drive(limit=1) == [TaskResult.LEASE_LOST]
    assert calls == []
    assert rig.store.steps(run_id)[1].status is StepStatus.RUNNING


def test_a_lease_stops_renewing_past_the_step_time_limit(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), LETTER, "g")
    version = rig.load(run_id).version
    lease = Lease(
        rig.store,
        rig.clock,
        run_id,
        "w1",
        version,
        ttl=10,
        expires_at=rig.clock.t + 10,
        deadline=rig.clock.t + 25,
    )
    assert lease.renew() and lease.version == version + 1
    rig.clock.advance(30)
    assert not lease.renew() and lease.lost and not lease.valid()
    assert lease.version == version + 1


def test_retry_waits_until_the_first_call_must_have_stopped(rig: Rig) -> None:
    run_id = _crash_mid_call(rig, LETTER)
    rig.drive(worker="w2")
    with pytest.raises(NotResolvable, match="may still be executing"):
        resolve(rig.runtime("operator"), run_id, Decision.RETRY)
    rig.clock.advance(rig.runtime().step_time_limit)
    assert resolve(rig.runtime("operator"), run_id, Decision.RETRY).run.status is RunStatus.RUNNING


@pytest.mark.parametrize("decision", list(Decision))
def test_a_result_stored_late_is_adopted_whatever_the_operator_says(
    rig: Rig, decision: Decision
) -> None:
    run_id = _crash_mid_call(rig, LETTER)
    rig.drive(worker="w2")
    # the first executor was alive after all, and stored its result meanwhile
    rig.store.put_tool_result(f"{run_id}:1", run_id, 1, "send_letter", "sent late", 0.0)
    resolve(rig.runtime("operator"), run_id, decision, "operator's guess", force=True)
    rig.drive(worker="w2")
    step = rig.store.steps(run_id)[1]
    assert (step.status, step.result) == (StepStatus.DONE, "sent late")
    assert rig.store.get_tool_result(f"{run_id}:1") == (True, "sent late")
    assert calls == [1]


def test_a_lost_resolve_race_leaves_no_record(rig: Rig) -> None:
    run_id = _crash_mid_call(rig, LETTER)
    rig.drive(worker="w2")
    stale = rig.runtime("operator")
    resolve(stale, run_id, Decision.FAIL)  # another operator was quicker
    with pytest.raises(DecisionConflict, match="step 1 was already resolved: fail"):
        resolve(stale, run_id, Decision.SUCCEEDED, "typo")
    assert not resolve(stale, run_id, Decision.FAIL).changed  # the same again: a no-op
    assert rig.store.get_tool_result(f"{run_id}:1") == (False, None)
