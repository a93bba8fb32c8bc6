"""The store's reads of runs that wait on the world, on every backend: the
oldest wait (``harness stats``), and the timeouts and children started that
the flight recorder holds (``/metrics``)."""

from __future__ import annotations

from typing import Any

import harness
from harness.engine import recovery, waits
from harness.engine.creation import create_run
from harness.store import OldestWait, Store
from tests.rig import Rig


@harness.tool(effect="idempotent")
def cw_wait_paid() -> harness.Deferred:
    return harness.Deferred(timeout=60, signal="paid")


def _agent(name: str, turns: list[dict[str, Any]], tools: list[Any]) -> str:
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=tools)
    )
    return name


PAYER = _agent(
    "cw-payer",
    [{"tool_calls": [{"name": "cw_wait_paid", "args": {}}]}, {"final": "paid"}],
    [cw_wait_paid],
)
HELPER = _agent("cw-helper", [{"final": "helped"}], [])
PARENT = _agent(
    "cw-parent",
    [{"tool_calls": [{"name": "cw-helper", "args": {"task": "help"}}]}, {"final": "done"}],
    [harness.agent_tool("cw-helper")],
)


def test_nothing_waits_in_an_empty_store(store: Store) -> None:
    assert store.oldest_wait() is None
    assert store.wait_events() == {"timeouts": 0, "children_started": 0}


def test_the_oldest_wait_is_the_deferred_call_that_started_first(store: Store) -> None:
    rig = Rig(store)
    rt = rig.runtime()
    first = create_run(rt, PAYER, "one")
    rig.drive()
    started = rig.clock.now()
    rig.clock.advance(100)
    second = create_run(rt, PAYER, "two")
    rig.drive()
    assert store.oldest_wait() == OldestWait(first, 1, started)
    waits.signal(rt, first, "paid", {"amount": 1})  # answered: no longer waiting
    rig.drive()
    found = store.oldest_wait()
    assert found is not None and (found.run_id, found.step) == (second, 1)
    assert found.since == started + 100


def test_timeouts_and_children_are_counted_from_the_recorder(store: Store) -> None:
    rig = Rig(store)
    rt = rig.runtime()
    create_run(rt, PAYER, "never paid")
    create_run(rt, PARENT, "delegate")
    rig.drive()
    assert store.wait_events() == {"timeouts": 0, "children_started": 1}
    rig.clock.advance(61)
    recovery.sweep(rt)
    rig.drive()
    assert store.wait_events() == {"timeouts": 1, "children_started": 1}
    assert store.oldest_wait() is None
