"""The in-memory store (harness.store.memory) under the engine and the public API.

The contract suite (tests/contract) holds MemoryStore to SQLStore's
semantics method by method; here whole runs go through it: the runner with
a crash and the sweeper's recovery (tests/rig.py), and ``import harness``'s
functions on a runtime built with ``api.use_store``, with no database file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import harness
from harness import api
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.records import RunStatus, StepStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig

CALLS: list[int] = []


class Crash(BaseException):
    """The worker dies mid-call (a SIGKILL, in-process)."""


@harness.tool(effect="idempotent")
def memory_count(n: int, ctx: harness.ToolContext) -> dict[str, int]:
    CALLS.append(n)
    if ctx.attempt == 1:
        raise Crash
    return {"n": n}


harness.register_agent(
    harness.Agent(
        name="memory-agent",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "memory_count", "args": {"n": 7}}]}, {"final": "seven"}]
        ),
        tools=[memory_count],
    )
)


@harness.tool(effect="idempotent")
def memory_echo(text: str) -> dict[str, str]:
    return {"echo": text}


harness.register_agent(
    harness.Agent(
        name="memory-echo",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "memory_echo", "args": {"text": "hi"}}]}, {"final": "ok"}]
        ),
        tools=[memory_echo],
    )
)


def test_a_run_crashed_mid_call_is_recovered_on_a_memory_store(memory_store: MemoryStore) -> None:
    CALLS.clear()
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), "memory-agent", "count", "mem-1")
    rig.drive(limit=1)
    with pytest.raises(Crash):
        rig.drive(limit=1)
    rig.clock.advance(rig.lease_ttl + 1)
    assert [r.run_id for r in recovery.sweep(rig.runtime("sweeper"))] == [run_id]
    rig.drive()

    run = memory_store.load(run_id)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "seven")
    steps = memory_store.steps(run_id)
    assert [(s.status, s.attempts) for s in steps] == [
        (StepStatus.DONE, 1),
        (StepStatus.DONE, 2),
        (StepStatus.DONE, 1),
    ]
    assert steps[1].result == {"n": 7} and CALLS == [7, 7]
    assert memory_store.get_tool_result(f"{run_id}:1") == (True, {"n": 7})
    assert "lease_takeover" in memory_store.event_counts()


def test_the_public_api_runs_on_a_memory_store(tmp_path: Path) -> None:
    """``api.use_store`` builds the runtime on the store given: runs start,
    move, list and cancel with no database anywhere."""
    store = MemoryStore()
    sent: list[tuple[str, int]] = []

    def send(run_id: str, cursor: int, **_: Any) -> None:
        sent.append((run_id, cursor))

    api.use_store(lambda settings: store)
    api.use_sender(lambda settings: send)
    run_id = harness.start_run("memory-echo", "echo", run_id="mem-api")
    other = harness.start_run("memory-echo", "echo again")
    assert harness.get_run(run_id).status is RunStatus.PENDING
    harness.cancel_run(other, "not wanted")
    while sent:
        run_step(api.runtime(), *sent.pop(0))

    assert harness.get_run(run_id).status is RunStatus.COMPLETED
    assert harness.get_steps(run_id)[1].result == {"echo": "hi"}
    assert harness.get_run(other).status is RunStatus.CANCELLED
    assert sorted(r.run_id for r in api.reads().list_runs().runs) == sorted([other, run_id])
    assert api.runtime().store is store
    assert not list(tmp_path.iterdir())  # no SQLite file, no broker folder
