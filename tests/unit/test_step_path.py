"""The step path (runner and recovery, end to end through the store) under the
situations an outside read found wrong: a result held when the run is lost,
back-offs, duplicates without a lease, throughput chains against the time limit,
and runs no worker can carry.

Driven in-process on SQLite with a hand-moved clock (tests/rig.py). The transition
functions alone, with no store, are tests/unit/test_transitions.py's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

import harness
from harness import agents
from harness.engine import recovery, transitions
from harness.engine.creation import create_run
from harness.engine.executor import Claim, ClaimState, NoCache
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.errors import StaleWriteError, StoreError
from harness.reads import Reads
from harness.records import RunStatus, StepStatus
from harness.store import Checkpoint
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.rig import Rig

CALLS: list[str] = []
TAKEOVER: list[Rig] = []  # set by a test: the tool's call is taken over mid-flight


def _take_over(run_id: str) -> None:
    """Another worker claims the run while its step executes (a stall outlived the lease)."""
    rig = TAKEOVER.pop()
    run = rig.load(run_id)
    assert run.current is not None
    rig.store.checkpoint(
        transitions.claim(run, run.current, worker="w2", now=rig.clock.now(), ttl=rig.lease_ttl)
    )


@harness.tool(effect="idempotent")
def write(n: int, ctx: harness.ToolContext) -> int:
    CALLS.append(ctx.idempotency_key)
    if TAKEOVER:
        _take_over(ctx.run_id)
    return n


@harness.tool(effect="at_most_once")
def pay(n: int, ctx: harness.ToolContext) -> int:
    CALLS.append(ctx.idempotency_key)
    if TAKEOVER:
        _take_over(ctx.run_id)
    return n


@harness.tool(effect="read_only")
def read(n: int, ctx: harness.ToolContext) -> int:
    CALLS.append(ctx.idempotency_key)
    return n


def _agent(name: str, tool: str, calls: int = 1, **kw: Any) -> str:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": tool, "args": {"n": i}}]} for i in range(calls)
    ]
    turns.append({"final": "done"})
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=[write, pay, read], **kw)
    )
    return name


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLS.clear()
    TAKEOVER.clear()
    yield Rig(memory_store)


def _events(rig: Rig, run_id: str) -> list[str]:
    return [e.to_status for e in rig.store.events(run_id)]


def _recover(rig: Rig, run_id: str, worker: str) -> list[TaskResult]:
    """The lease lapses, the sweeper re-sends the run, ``worker`` carries it on."""
    rig.sent.clear()
    rig.clock.advance(rig.lease_ttl + 1)
    assert [s.run_id for s in recovery.sweep(rig.runtime("sweeper"))] == [run_id]
    return rig.drive(worker=worker)


# -- defect 1: a result the worker holds is never thrown away -----------------


@pytest.mark.parametrize("tool", ["write", "pay"])
def test_a_result_held_when_the_run_was_taken_over_is_adopted(rig: Rig, tool: str) -> None:
    """The lease is lost while the tool runs: the result checkpoint fails as
    stale, and the result is kept in the SQL record, so the next owner adopts
    it: no second call, and an at_most_once step does not go in doubt."""
    run_id = create_run(rig.runtime(), _agent(f"sm-takeover-{tool}", tool), "g")
    rig.drive(limit=1)  # the model step
    TAKEOVER.append(rig)
    assert rig.drive(limit=1) == [TaskResult.LEASE_LOST]
    assert rig.store.get_tool_result(f"{run_id}:1") == (True, 0)

    assert _recover(rig, run_id, "w3")[-1] is TaskResult.COMPLETED
    assert [f"{run_id}:1"] == CALLS
    step = rig.store.steps(run_id)[1]
    assert (step.status, step.result) == (StepStatus.DONE, 0)
    assert "in_doubt" not in _events(rig, run_id)


class DownForCheckpoints:
    """The store refuses every checkpoint (the database is unreachable) but for
    those of the model step; ``records``: whether tool records still get in."""

    def __init__(self, store: SQLStore, records: bool) -> None:
        self.store = store
        self.records = records

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, cp: Checkpoint) -> int:
        if cp.tool_record is not None:
            raise StoreError("database error: connection refused")
        return self.store.checkpoint(cp)

    def put_tool_result(self, *args: Any) -> Any:
        if not self.records:
            raise StoreError("database error: connection refused")
        return self.store.put_tool_result(*args)


def test_a_result_whose_checkpoint_outlasted_the_lease_is_kept(rig: Rig) -> None:
    """The database is down at the result checkpoint for longer than the lease:
    the write gives up (the StoreError goes to Celery, which retries), and the
    result it held is in the SQL record for whoever resumes the step."""
    run_id = create_run(rig.runtime(), _agent("sm-outage", "write"), "g")
    rig.drive(limit=1)
    sql = rig.store
    rig.store = DownForCheckpoints(sql, records=True)  # type: ignore[assignment]
    with pytest.raises(StoreError):
        rig.drive(limit=1)
    rig.store = sql
    assert rig.store.get_tool_result(f"{run_id}:1") == (True, 0)
    assert _recover(rig, run_id, "w2")[-1] is TaskResult.COMPLETED
    assert [f"{run_id}:1"] == CALLS


class RememberingCache(NoCache):
    """An in-memory stand-in for Redis: claims and completed results."""

    def __init__(self) -> None:
        self.done: dict[str, Any] = {}

    def claim(self, key: str, owner: str, ttl: float) -> Claim:
        if key in self.done:
            return Claim(ClaimState.DONE, self.done[key])
        return Claim(ClaimState.ACQUIRED)

    def complete(self, key: str, owner: str, result: Any) -> None:
        self.done[key] = result


def test_with_sql_down_the_result_is_kept_in_the_cache(rig: Rig) -> None:
    """SQL refuses even the record: the cache keeps the result, the next owner
    adopts it from there and its checkpoint writes the missing SQL record."""
    rig.cache = RememberingCache()
    run_id = create_run(rig.runtime(), _agent("sm-sql-down", "write"), "g")
    rig.drive(limit=1)
    sql = rig.store
    rig.store = DownForCheckpoints(sql, records=False)  # type: ignore[assignment]
    with pytest.raises(StoreError):
        rig.drive(limit=1)
    rig.store = sql
    assert rig.store.get_tool_result(f"{run_id}:1") == (False, None)
    assert _recover(rig, run_id, "w2")[-1] is TaskResult.COMPLETED
    assert [f"{run_id}:1"] == CALLS
    assert rig.store.get_tool_result(f"{run_id}:1") == (True, 0)


# -- defects 2 and 3: waiting on a busy key --------------------------------------


class BusyFor(NoCache):
    """The step's key is held by another executor for the first ``n`` claims."""

    def __init__(self, n: int) -> None:
        self.left = n

    def claim(self, key: str, owner: str, ttl: float) -> Claim:
        if self.left > 0:
            self.left -= 1
            return Claim(ClaimState.BUSY, retry_after=2.0)
        return Claim(ClaimState.ACQUIRED)


@pytest.mark.parametrize("found", ["pending", "running"])
def test_a_back_off_is_neither_an_attempt_nor_a_recovery(rig: Rig, found: str) -> None:
    """Three back-offs on a busy key with max_attempts=2: the run still completes,
    the step counts the attempts that executed, and only a real interruption
    (``found="running"``: a worker died mid-step first) is counted as recovered."""
    run_id = create_run(rig.runtime(), _agent(f"sm-busy-{found}", "write", max_attempts=2), "g")
    rig.drive(limit=1)
    if found == "running":  # the first executor dies after its RUNNING checkpoint
        run = rig.load(run_id)
        assert run.current is not None
        rig.store.checkpoint(
            transitions.claim(run, run.current, worker="w0", now=rig.clock.now(), ttl=30)
        )
        rig.clock.advance(31)
    rig.cache = BusyFor(3)
    outcomes = []
    for _ in range(4):
        rig.sent.clear()
        rig.clock.advance(rig.lease_ttl + 1)
        recovery.sweep(rig.runtime("sweeper"))
        outcomes += rig.drive(worker="w1")
    assert outcomes[:3] == [TaskResult.BUSY] * 3
    assert rig.load(run_id).status is RunStatus.COMPLETED
    step = rig.store.steps(run_id)[1]
    assert step.attempts == (2 if found == "running" else 1)
    assert _events(rig, run_id).count("recovered_running") == (found == "running")
    assert _events(rig, run_id).count("backed_off") == 3
    stats = Reads(rig.store, rig.clock, 900).stats()
    assert (stats["back_offs"], stats["recovered_running_steps"]) == (3, found == "running")
    assert "lease_takeover" not in _events(rig, run_id)[-6:]
    assert [f"{run_id}:1"] == CALLS


def test_a_duplicate_without_the_lease_never_writes(rig: Rig) -> None:
    """A duplicate message for a read_only step that went straight through (no
    lease written yet) meets the busy key of the copy under way: it is dropped
    without a write, so the executing copy's result checkpoint still lands."""
    run_id = create_run(rig.runtime(), _agent("sm-dup", "read"), "g")
    rig.drive(limit=1)
    before = rig.load(run_id)
    rig.cache = BusyFor(1)
    assert run_step(rig.runtime("w2"), run_id, cursor=1) is TaskResult.DUPLICATE
    assert rig.load(run_id).version == before.version
    rig.cache = NoCache()
    assert run_step(rig.runtime("w1"), run_id, cursor=1) is TaskResult.ADVANCED


# -- defect 4: throughput mode against the time limit ---------------------------


@harness.tool(effect="idempotent")
def slow(n: int, ctx: harness.ToolContext) -> int:
    TICK[0].clock.advance(25)  # each call takes 25 s
    return n


TICK: list[Rig] = []


def test_a_chain_starts_no_step_past_its_time_budget(rig: Rig) -> None:
    """steps_per_task=20 with a 60 s chain budget and 25 s steps: one task runs
    the steps it starts within 60 s (steps 0 to 5, started at 0, 0, 25, 25, 50
    and 50 s: the tools take the time) and then hops, whatever the count allows."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "slow", "args": {"n": i}}]} for i in range(5)
    ]
    turns.append({"final": "done"})
    harness.register_agent(
        harness.Agent(
            name="sm-chain",
            model=harness.ScriptedModel(turns),
            tools=[slow],
            steps_per_task=20,
            max_steps=50,
        )
    )
    TICK[:] = [rig]
    run_id = create_run(rig.runtime(), "sm-chain", "g")
    rig.sent.clear()
    rt = replace(rig.runtime(), chain_budget=60.0)
    assert run_step(rt, run_id, cursor=0) is TaskResult.ADVANCED
    assert rig.load(run_id).cursor == 6
    assert rig.sent == [(run_id, 6)]


# -- defect 6: runs no worker here can carry --------------------------------------


def test_a_run_whose_agent_is_missing_is_resent_ever_more_rarely(rig: Rig) -> None:
    """No worker has the agent: the sweeper's re-sends double their spacing, the
    reason is recorded once (and shown), and once a worker that has the agent
    gets the message (a rolling deploy), the run moves and all that is cleared."""
    name = _agent("sm-ghost", "write")
    run_id = create_run(rig.runtime(), name, "g")
    ghost = agents._AGENTS.pop(name)
    try:
        assert rig.drive() == [TaskResult.NO_AGENT]
        assert rig.load(run_id).version == 1  # the normal path writes nothing
        resent_at = []
        for _ in range(48):
            rig.clock.advance(rig.lease_ttl / 2)
            if recovery.sweep(rig.runtime("sweeper")):
                resent_at.append(rig.clock.now())
                worker = f"w{len(resent_at) % 3}"  # several workers, none has the agent
                assert rig.drive(worker=worker) == [TaskResult.NO_AGENT]
    finally:
        agents.register_agent(ghost)
    gaps = [b - a for a, b in itertools.pairwise(resent_at)]
    assert len(gaps) >= 3 and gaps == sorted(set(gaps)), gaps  # ever further apart
    assert gaps[-1] >= 4 * rig.lease_ttl, gaps
    run = rig.load(run_id)
    assert run.blocked == "no agent named 'sm-ghost' on the worker that took it"
    assert _events(rig, run_id).count("blocked") == 1
    assert run.to_dict()["blocked"] == run.blocked
    assert Reads(rig.store, rig.clock, 900).stats()["runs_blocked"] == 1

    rig.clock.advance(run.wake_at - rig.clock.now() + 1 if run.wake_at else 0)
    recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive()[-1] is TaskResult.COMPLETED
    run = rig.load(run_id)
    assert (run.blocked, run.resends) == (None, 0)


def test_a_run_with_no_runnable_step_is_blocked_not_resent_at_full_rate(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), _agent("sm-stuck", "write"), "g")
    rig.drive(limit=1)
    run = rig.load(run_id)
    # A step left DONE under the cursor (a manual edit of the store, say).
    rig.store.checkpoint(
        Checkpoint(run_id, run.version, "test", rig.clock.now(), steps=(_done(1),))
    )
    for _ in range(3):
        rig.clock.advance(rig.lease_ttl * 8)
        recovery.sweep(rig.runtime("sweeper"))
        rig.drive()
    run = rig.load(run_id)
    assert run.blocked == "no runnable step at cursor 1"
    assert _events(rig, run_id).count("blocked") == 1
    assert run.resends == 3


def _done(index: int) -> Any:
    from harness.store import StepPatch

    return StepPatch(index, status=StepStatus.DONE)


# -- found by review ---------------------------------------------------------------


def test_a_claim_after_re_sends_is_recovered_one_ttl_after_a_crash(rig: Rig) -> None:
    """Re-sends space out the run's wake-up; a claim must bring it back to one
    TTL, or a worker killed after the claim would leave its run for 8 TTLs."""
    run_id = create_run(rig.runtime(), _agent("sm-wake", "write"), "g")
    rig.drive(limit=1)
    for _ in range(3):  # three step messages lost in a row
        rig.sent.clear()
        rig.clock.advance(rig.lease_ttl * 8)
        recovery.sweep(rig.runtime("sweeper"))
    run = rig.load(run_id)
    assert run.resends == 3 and run.current is not None
    rig.store.checkpoint(  # w0 claims the step, then is killed
        transitions.claim(run, run.current, worker="w0", now=rig.clock.now(), ttl=rig.lease_ttl)
    )
    rig.clock.advance(rig.lease_ttl + 1)
    assert [s.run_id for s in recovery.sweep(rig.runtime("sweeper"))] == [run_id]


class ReplyLost:
    """The claim commits, but its connection drops before the reply: the retry
    finds the version moved and reports a stale write."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store
        self.dropped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, cp: Checkpoint) -> int:
        version = self.store.checkpoint(cp)
        claims = any(p.status is StepStatus.RUNNING for p in cp.steps)
        if claims and not self.dropped:
            self.dropped = True
            raise StaleWriteError(cp.run_id, cp.expected_version)
        return version


def test_a_claim_that_committed_without_a_reply_carries_on(rig: Rig) -> None:
    """Not a lost race: an at_most_once step goes on to its call, once, instead
    of being left RUNNING for the next owner to find in doubt."""
    run_id = create_run(rig.runtime(), _agent("sm-reply", "pay"), "g")
    rig.drive(limit=1)
    sql = rig.store
    rig.store = ReplyLost(sql)  # type: ignore[assignment]
    assert rig.drive(limit=1) == [TaskResult.ADVANCED]
    rig.store = sql
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert [f"{run_id}:1"] == CALLS
    assert "in_doubt" not in _events(rig, run_id)


@harness.tool(effect="read_only")
def peek(ctx: harness.ToolContext) -> str:
    """Reports whether its step was checkpointed RUNNING before the call."""
    step = TICK[0].store.steps(ctx.run_id)[ctx.step_index]
    return str(step.status)


def test_a_message_too_close_to_the_wake_up_takes_the_careful_path(rig: Rig) -> None:
    """Straight through only if the first heartbeat (TTL/3 in) writes the lease
    well before the sweeper may re-send the run (TTL/2 ahead): otherwise the
    step is checkpointed RUNNING first, so the sweeper does not fence it off."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "peek", "args": {}}]},
        {"tool_calls": [{"name": "peek", "args": {}}]},
        {"final": "done"},
    ]
    harness.register_agent(
        harness.Agent(name="sm-edge", model=harness.ScriptedModel(turns), tools=[peek])
    )
    TICK[:] = [rig]
    run_id = create_run(rig.runtime(), "sm-edge", "g")
    rig.drive(limit=1)
    assert rig.drive(limit=1) == [TaskResult.ADVANCED]  # on time: straight through
    rig.drive(limit=1)
    rig.clock.advance(rig.lease_ttl / 2 + 0.5)  # less than TTL/2 before the wake-up
    assert rig.drive()[-1] is TaskResult.COMPLETED
    steps = rig.store.steps(run_id)
    assert (steps[1].result, steps[3].result) == ("pending", "running")


def test_a_resent_run_is_not_leased_on_any_clock(rig: Rig) -> None:
    """The sweeper's mark lapses at time 0, so a worker whose clock is behind the
    sweeper's still takes the re-sent message."""
    run_id = create_run(rig.runtime(), _agent("sm-skew", "write"), "g")
    rig.sent.clear()
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    run = rig.load(run_id)
    assert run.owner == transitions.SWEEPER
    assert not run.lease_live(rig.clock.now() - 5.0)
    rig.clock.advance(-5.0)
    assert rig.drive()[-1] is TaskResult.COMPLETED


class Claims(NoCache):
    """Notes who claims each key."""

    def __init__(self) -> None:
        self.owners: list[str] = []

    def claim(self, key: str, owner: str, ttl: float) -> Claim:
        self.owners.append(owner)
        return Claim(ClaimState.ACQUIRED)


def test_each_execution_claims_the_key_as_itself(rig: Rig) -> None:
    """Two executions in one worker process (a threads pool) must not share the
    idempotency claim: the owner is the execution, not the worker."""
    rig.cache = cache = Claims()
    run_id = create_run(rig.runtime(), _agent("sm-token", "write", calls=2), "g")
    rig.drive(worker="w1")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert len(cache.owners) == 2 and len(set(cache.owners)) == 2
    assert all(owner.startswith("w1/") for owner in cache.owners)


class ThreadWinsFirst:
    """Another thread of the same worker claims the run at the same instant,
    first: our claim then matches no row."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, cp: Checkpoint) -> int:
        if any(p.status is StepStatus.RUNNING for p in cp.steps):
            self.store.checkpoint(replace(cp, run=replace(cp.run, owner="w1/other")))
            raise StaleWriteError(cp.run_id, cp.expected_version)
        return self.store.checkpoint(cp)


def test_a_claim_won_by_another_thread_of_the_same_worker_is_not_ours(rig: Rig) -> None:
    """Owners are executions, so a same-instant claim by a sibling thread is not
    mistaken for our own claim that landed without a reply."""
    run_id = create_run(rig.runtime(), _agent("sm-sibling", "pay"), "g")
    rig.drive(limit=1)
    rig.store = ThreadWinsFirst(rig.store)  # type: ignore[assignment]
    assert rig.drive(limit=1) == [TaskResult.RACED]
    assert CALLS == []
    assert rig.load(run_id).owner == "w1/other"


# Waiting for a provider: the reschedule transition ------------------------------


def _waiting(rig: Rig, retry: bool) -> tuple[str, float]:
    run_id = create_run(rig.runtime(), _agent("wait", "read"), "wait")
    rig.sent.clear()  # its first message was the one that met the provider's refusal
    run = rig.load(run_id)
    assert run.current is not None
    wait = transitions.Reschedule(30.0, "HTTP 429: slow down", retry=retry)
    now = rig.clock.now()
    rig.store.checkpoint(
        transitions.reschedule(
            run, run.current, wait, version=run.version, worker="w1", now=now, claimed=False
        )
    )
    return run_id, now


@pytest.mark.parametrize("retry", [True, False])
def test_a_rescheduled_step_is_pending_with_its_wake_up_and_no_lease(rig: Rig, retry: bool) -> None:
    run_id, now = _waiting(rig, retry)
    run = rig.load(run_id)
    step = run.current
    assert step is not None
    assert (step.status, step.attempts) == (StepStatus.PENDING, 0)
    # A retry is counted and says why; a rate-limit wait is neither.
    assert step.retries == (1 if retry else 0)
    assert step.error == ("HTTP 429: slow down" if retry else None)
    assert (run.owner, run.lease_expires_at, run.wake_at) == (
        transitions.RESCHEDULED,
        transitions.LAPSED,
        now + 30,
    )
    kind = "retry_scheduled" if retry else "rate_limited"
    assert rig.store.events(run_id)[-1].to_status == kind


def test_the_sweeper_waits_for_the_wake_up_then_marks_the_run_resent(rig: Rig) -> None:
    run_id, _ = _waiting(rig, retry=True)
    assert recovery.sweep(rig.runtime()) == []  # not due yet
    rig.clock.advance(31)
    (sent,) = recovery.sweep(rig.runtime())
    assert "wait over" in sent.reason
    # Marked as re-sent: its message is not taken for an early one.
    assert rig.load(run_id).owner == transitions.SWEEPER
    assert rig.drive() == [TaskResult.ADVANCED, TaskResult.ADVANCED, TaskResult.COMPLETED]
    events = [e.to_status for e in rig.store.events(run_id)]
    assert "lease_takeover" not in events and "recovered_running" not in events


def test_the_delayed_message_on_time_takes_the_careful_path(rig: Rig) -> None:
    run_id, _ = _waiting(rig, retry=True)
    rig.sent.append((run_id, 0))
    assert rig.drive(limit=1) == [TaskResult.EARLY]
    rig.clock.advance(30)
    rig.sent.append((run_id, 0))
    assert rig.drive(limit=1) == [TaskResult.ADVANCED]
    step = rig.store.steps(run_id)[0]
    assert (step.status, step.attempts, step.retries) == (StepStatus.DONE, 1, 1)
