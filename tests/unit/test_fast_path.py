"""Checkpoint placement and throughput mode, driven in-process on SQLite.

A step safe to run twice (a model step, a ``read_only`` tool) on its normal
path goes straight to execution: its result checkpoint is its only write. A
tool that acts on the world is checkpointed RUNNING first, always. In
throughput mode a task runs on through consecutive steps that are safe to
rerun, each still checkpointed, and hops before an ``at_most_once`` tool.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import Run, RunStatus, StepStatus
from harness.store import Checkpoint, ClaimGuard
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.rig import Rig

CALLS: list[str] = []


@harness.tool(effect="idempotent")
def write(n: int, ctx: harness.ToolContext) -> int:
    CALLS.append(ctx.idempotency_key)
    return n


@harness.tool(effect="read_only")
def read(n: int, ctx: harness.ToolContext) -> int:
    CALLS.append(ctx.idempotency_key)
    return n


@harness.tool(effect="at_most_once")
def pay(n: int, ctx: harness.ToolContext) -> int:
    CALLS.append(ctx.idempotency_key)
    return n


TOOLS = [write, read, pay]


def _agent(name: str, calls: list[str], **kw: Any) -> str:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": tool, "args": {"n": i}}]} for i, tool in enumerate(calls)
    ]
    turns.append({"final": "done"})
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=TOOLS, **kw)
    )
    return name


class Recording:
    """The store, noting every checkpoint it applies."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store
        self.checkpoints: list[Checkpoint] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, cp: Checkpoint) -> int:
        self.checkpoints.append(cp)
        return self.store.checkpoint(cp)

    def claim_loaded(self, cp: Checkpoint, guard: ClaimGuard) -> tuple[Run, int] | None:
        claimed = self.store.claim_loaded(cp, guard)
        if claimed is not None:  # the claim a message's hint let through, without a load
            self.checkpoints.append(cp)
        return claimed

    def running_writes(self) -> list[int]:
        """Indexes of the steps checkpointed RUNNING."""
        return [p.index for cp in self.checkpoints for p in cp.steps if p.status == "running"]


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLS.clear()
    yield Rig(Recording(memory_store))  # type: ignore[arg-type]


def _recording(rig: Rig) -> Recording:
    assert isinstance(rig.store, Recording)
    return rig.store


def test_only_tools_that_act_on_the_world_are_checkpointed_running(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), _agent("fp-mix", ["write", "read", "pay"]), "g")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    # steps: 0 model, 1 write, 2 model, 3 read, 4 model, 5 pay, 6 model
    assert _recording(rig).running_writes() == [1, 5]
    assert len(_recording(rig).checkpoints) == 7 + 2  # one result each, two RUNNING
    steps = rig.store.steps(run_id)
    assert all(s.status is StepStatus.DONE and s.attempts == 1 for s in steps)
    assert all(s.started_at is not None and s.finished_at is not None for s in steps)
    events = [(e.step_index, e.from_status, e.to_status) for e in rig.store.events(run_id)]
    assert events[:3] == [
        (None, None, "pending"),
        (None, "pending", "running"),
        (0, "pending", "done"),
    ]
    assert (1, "pending", "running") in events and (1, "running", "done") in events
    assert (3, "pending", "done") in events


def test_always_checkpoints_every_step_running(rig: Rig) -> None:
    name = _agent("fp-always", ["read"], running_checkpoint="always")
    run_id = create_run(rig.runtime(), name, "g")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert _recording(rig).running_writes() == [0, 1, 2]


def test_a_step_re_sent_by_the_sweeper_takes_the_careful_path(rig: Rig) -> None:
    """The message was lost or a worker died with it: even a model step is then
    checkpointed RUNNING, so a step that kills every worker has its attempts
    counted and cannot loop forever."""
    run_id = create_run(rig.runtime(), _agent("fp-late", []), "g")
    rig.sent.clear()  # the first message is lost
    rig.clock.advance(rig.lease_ttl + 1)
    assert [s.cursor for s in recovery.sweep(rig.runtime("sweeper"))] == [0]
    rig.drive()  # the sweeper's message comes in time
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert _recording(rig).running_writes() == [0]
    kinds = [e.to_status for e in rig.store.events(run_id)]
    assert "lease_takeover" not in kinds and "redispatched" in kinds


def test_a_late_message_takes_the_careful_path(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), _agent("fp-slow", []), "g")
    rig.clock.advance(rig.lease_ttl + 1)  # a queue backed up past the wake-up time
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert _recording(rig).running_writes() == [0]


class Dies(BaseException):
    """Stands in for the process dying inside the model call."""


class DeadlyModel:
    records_responses = False  # free and deterministic, like ScriptedModel: the fast path

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        raise Dies


def test_a_model_step_that_kills_every_worker_fails_the_run(rig: Rig) -> None:
    """The first death leaves no trace (the fast path wrote nothing); from the
    sweeper's re-send on, each attempt is counted, and max_attempts ends it."""
    harness.register_agent(harness.Agent("fp-doomed", DeadlyModel(), max_attempts=2))
    run_id = create_run(rig.runtime(), "fp-doomed", "g")
    for _ in range(3):
        with pytest.raises(Dies):
            rig.drive(limit=1)
        rig.clock.advance(rig.lease_ttl + 1)
        assert len(recovery.sweep(rig.runtime("sweeper"))) == 1
    assert rig.drive() == [TaskResult.FAILED]
    run = rig.load(run_id)
    assert run.status is RunStatus.FAILED and "max_attempts=2" in (run.error or "")
    assert rig.store.steps(run_id)[0].attempts == 2


class Racing:
    """A model whose first call lets another worker run the same step meanwhile."""

    records_responses = False  # free and deterministic: it takes the fast path

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.outcomes: list[TaskResult] = []

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        if not self.outcomes:
            self.outcomes.append(TaskResult.RACED)  # marks the nested call as running
            self.outcomes.append(run_step(self.rig.runtime("w2"), request.run_id, 0))
            self.rig.clock.advance(0.5)  # w1 records later than w2 did
        return harness.ModelTurn(final="done")


def test_two_copies_of_a_fast_step_run_but_only_one_is_recorded(rig: Rig) -> None:
    """A duplicated message: two workers execute the same model step at once,
    neither having written first; the version lets only one record it."""
    model = Racing(rig)
    harness.register_agent(harness.Agent("fp-race", model))
    run_id = create_run(rig.runtime(), "fp-race", "g")
    assert run_step(rig.runtime("w1"), run_id, 0) is TaskResult.LEASE_LOST
    assert model.outcomes[1] is TaskResult.COMPLETED
    step = rig.store.steps(run_id)[0]
    assert (step.status, step.attempts) == (StepStatus.DONE, 1)
    assert rig.load(run_id).status is RunStatus.COMPLETED


def test_throughput_mode_runs_on_through_safe_steps_and_hops_before_at_most_once(
    rig: Rig,
) -> None:
    name = _agent("fp-chain", ["write", "read", "pay", "write"], steps_per_task=50)
    run_id = create_run(rig.runtime(), name, "g")
    assert rig.drive() == [TaskResult.ADVANCED, TaskResult.COMPLETED]
    assert rig.load(run_id).status is RunStatus.COMPLETED
    # the first task ran steps 0-4 and sent step 5 (pay) a message of its own
    assert rig.sent == []
    steps = rig.store.steps(run_id)
    assert [s.status for s in steps] == [StepStatus.DONE] * 9
    assert len(CALLS) == 4
    assert len(_recording(rig).checkpoints) == 9 + 3  # every step still checkpointed


def test_throughput_mode_stops_at_its_step_count(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), _agent("fp-count", ["write"] * 3, steps_per_task=3), "g")
    dispatched = []
    while rig.sent:
        dispatched.append(rig.sent[0][1])
        rig.drive(limit=1)
    assert dispatched == [0, 3, 6]  # steps 0-2, 3-5, then 6 completes the run
    assert rig.load(run_id).status is RunStatus.COMPLETED


def test_steps_per_task_and_running_checkpoint_are_validated() -> None:
    model = harness.ScriptedModel([{"final": "x"}])
    with pytest.raises(ValueError, match="steps_per_task"):
        harness.Agent("bad", model, steps_per_task=0)
    with pytest.raises(ValueError, match="running_checkpoint"):
        harness.Agent("bad", model, running_checkpoint="never")
