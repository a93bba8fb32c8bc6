"""Forks and replays of runs that waited on the world (issue 23), in process
on the in-memory store: a fork before a child's step starts a child of its
own, under the fork's id; a fork copies only settled steps, never a parent
link nor a mark of calls still out; a replay serves a completion recorded
as the call's answer instead of waiting again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness
from harness.engine import waits
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.errors import BadForkPoint
from harness.records import ParentRef, RunStatus, StepStatus, WaitKind
from harness.replay.rerun import replay_run
from harness.runs.fork import fork_points, fork_run
from harness.store.memory import MemoryStore
from tests.rig import Rig

CALLS: list[str] = []


@harness.tool(effect="idempotent")
def fw_ship(parcel: str, ctx: harness.ToolContext) -> harness.Deferred:
    """Ask the courier to ship; it answers later."""
    CALLS.append(ctx.idempotency_key)
    return harness.Deferred(timeout=3600)


def _calls(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


harness.register_agent(
    harness.Agent(
        name="fw-researcher", model=harness.ScriptedModel([{"final": "found it"}]), tools=[]
    )
)
harness.register_agent(
    harness.Agent(
        name="fw-planner",
        model=harness.ScriptedModel(
            [_calls("fw-researcher", {"task": "find x"}), {"final": "planned"}]
        ),
        tools=[harness.agent_tool("fw-researcher")],
    )
)
harness.register_agent(
    harness.Agent(
        name="fw-shipper",
        model=harness.ScriptedModel([_calls("fw_ship", {"parcel": "p1"}), {"final": "shipped"}]),
        tools=[fw_ship],
    )
)


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLS.clear()
    yield Rig(memory_store)


def test_a_fork_before_a_childs_step_starts_its_own_child(rig: Rig) -> None:
    rt = rig.runtime()
    origin = create_run(rt, "fw-planner", "plan", "plan-1")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert [c.run_id for c in rig.store.children(origin)] == ["plan-1:1"]

    fork = fork_run(rt, origin, 0, new_run_id="plan-f")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    (child,) = rig.store.children(fork)
    assert (child.run_id, child.parent) == ("plan-f:1", ParentRef("plan-f", 1))
    assert child.status is RunStatus.COMPLETED
    assert rig.store.steps(fork, 1, 1)[0].result == "found it"
    assert [c.run_id for c in rig.store.children(origin)] == ["plan-1:1"]  # the origin's own


def test_a_fork_after_a_childs_step_copies_its_answer_and_starts_none(rig: Rig) -> None:
    rt = rig.runtime()
    origin = create_run(rt, "fw-planner", "plan", "plan-2")
    rig.drive()
    fork = fork_run(rt, origin, 2, new_run_id="plan-g")
    copied = rig.store.steps(fork, 1, 1)[0]
    assert (copied.status, copied.result) == (StepStatus.DONE, "found it")
    assert copied.wait is not None and copied.wait.kind is WaitKind.CHILD  # as recorded
    rig.drive()
    assert rig.load(fork).status is RunStatus.COMPLETED
    assert rig.store.children(fork) == []


def test_a_fork_of_a_child_is_no_child(rig: Rig) -> None:
    rt = rig.runtime()
    create_run(rt, "fw-planner", "plan", "plan-3")
    rig.drive()
    child = rig.load("plan-3:1")
    assert child.parent == ParentRef("plan-3", 1)
    fork = fork_run(rt, child.run_id, 0, new_run_id="child-f")
    rig.drive()
    forked = rig.load(fork)
    assert forked.parent is None and forked.status is RunStatus.COMPLETED
    # its end answered nobody: the parent's step is as the child's own end left it
    assert rig.store.steps("plan-3", 1, 1)[0].result == "found it"


def test_a_fork_copies_only_settled_steps(rig: Rig) -> None:
    rt = rig.runtime()
    origin = create_run(rt, "fw-shipper", "ship", "ship-1")
    assert rig.drive()[-1] is TaskResult.WAITING
    steps = rig.store.steps(origin)
    assert steps[1].status is StepStatus.DEFERRED
    assert fork_points(steps) == [0]  # the turn after the call still out is none
    with pytest.raises(BadForkPoint, match="step 1 before it is deferred"):
        fork_run(rt, origin, 2)


def test_a_fork_takes_no_mark_of_calls_out_nor_a_call_of_its_own(rig: Rig) -> None:
    rt = rig.runtime()
    origin = create_run(rt, "fw-shipper", "ship", "ship-3")
    rig.drive(limit=1)  # the model turn: the call queued
    early = waits.complete(rt, origin, 1, result={"tracking": "T1"}, by="courier")
    assert early.delivery is waits.Delivery.KEPT
    rig.drive(limit=1)  # the call defers and takes its answer at once
    run = rig.load(origin)
    assert (run.status, run.cursor, run.deferred_from) == (RunStatus.RUNNING, 2, 1)
    fork = fork_run(rt, origin, 2, new_run_id="ship-f")
    forked = rig.load(fork)
    assert (forked.deferred_from, forked.parent, forked.cursor) == (None, None, 2)
    rig.drive()
    assert rig.load(fork).status is RunStatus.COMPLETED
    assert rig.load(origin).status is RunStatus.COMPLETED
    assert rig.store.steps(fork, 1, 1)[0].result == {"tracking": "T1"}
    assert [f"{origin}:1"] == CALLS  # the fork made no call of its own


def test_a_replay_serves_a_recorded_completion(rig: Rig) -> None:
    rt = rig.runtime()
    origin = create_run(rt, "fw-shipper", "ship", "ship-2")
    rig.drive()
    waits.complete(rt, origin, 1, result={"tracking": "T9"}, by="courier")
    rig.drive()
    assert rig.load(origin).status is RunStatus.COMPLETED

    replay = replay_run(rt, origin, "fw-shipper", new_run_id="ship-r")
    outcomes = rig.drive()
    assert outcomes[-1] is TaskResult.COMPLETED, outcomes
    step = rig.store.steps(replay, 1, 1)[0]
    assert (step.status, step.result) == (StepStatus.DONE, {"tracking": "T9"})
    assert rig.load(replay).status is RunStatus.COMPLETED
    assert [f"{origin}:1"] == CALLS  # served from the recording: no call, no wait
