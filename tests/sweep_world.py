"""A store full of runs that wait, for the sweep's reads (issue 26, goal 5).

Three runs, one for each way a run waits on the world or an operator (a
deferred call, a sleep, a call awaiting approval), each a day long, are
carried to their wait by the real engine (tests.rig: no broker, no worker)
and given the sweeper's first look; then they are cloned (PostgreSQL,
tests.seeding.clone_run) into as many as asked, beside runs that have
ended. Runs whose one-second wait is over are added as the due ones. Used by
tests/integration/test_sweep_reads.py and ``python -m bench.sweep``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine, text

import harness
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.transitions.resends import MAX_RESEND_DOUBLINGS
from harness.records import RunStatus
from harness.store.sql import SQLStore
from tests.rig import Rig
from tests.seeding import clone_run

DAY = 86_400.0


@harness.tool(effect="idempotent")
def sw_courier(ctx: harness.ToolContext) -> harness.Deferred:
    """Ask a courier for a delivery; it answers within a day."""
    return harness.Deferred(timeout=DAY)


@harness.tool(effect="idempotent")
def sw_nap() -> harness.Sleep:
    """Wake up tomorrow."""
    return harness.Sleep(DAY)


@harness.tool(effect="at_most_once", requires_approval=True)
def sw_refund(order: int) -> str:
    """A refund an operator approves first."""
    return f"refunded {order}"


@harness.tool(effect="idempotent")
def sw_quick(ctx: harness.ToolContext) -> harness.Deferred:
    """An answer that never comes: the one-second timeout is due at the sweep."""
    return harness.Deferred(timeout=1.0)


def _agent(name: str, tool: Any | None, args: dict[str, Any]) -> str:
    turns: list[dict[str, Any]] = [{"final": "done"}]
    if tool is not None:
        turns.insert(0, {"tool_calls": [{"name": tool.name, "args": args}]})
    tools = [] if tool is None else [tool]
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=tools)
    )
    return name


#: One agent for each way a run waits: deferred, sleeping, awaiting approval.
WAITING = (
    _agent("sw-deferred", sw_courier, {}),
    _agent("sw-sleeping", sw_nap, {}),
    _agent("sw-approval", sw_refund, {"order": 1234}),
)
DUE = _agent("sw-due", sw_quick, {})
ENDED = _agent("sw-ended", None, {})


def _blocked(rig: Rig) -> str:
    """A run no worker carries: its messages lost, re-sent by the sweeper
    until its re-sends are 32 lease TTLs apart (transitions.resend_delay)."""
    rt = rig.runtime()
    run_id = create_run(rt, ENDED, "the blocked template")
    for _ in range(MAX_RESEND_DOUBLINGS + 1):
        rig.sent.clear()
        rig.resent.clear()
        wake = rig.store.load(run_id).wake_at
        assert wake is not None
        rig.clock.t = max(rig.clock.t, wake + 1)
        assert [r.run_id for r in recovery.sweep(rt, probe=False)] == [run_id]
    rig.sent.clear()
    rig.resent.clear()
    return run_id


def seed(rig: Rig, store: SQLStore, waiting: int, ended: int = 0, blocked: int = 0) -> None:
    """``waiting`` runs, a third of each kind, as the engine leaves them,
    ``ended`` completed runs, and ``blocked`` runs that no worker carries;
    then VACUUM ANALYZE, as autovacuum would have done in a deployment that
    has been running."""
    rt = rig.runtime()
    if blocked:
        clone_run(store.engine, _blocked(rig), blocked - 1)
    templates = [create_run(rt, agent, "the template") for agent in WAITING]
    rig.drive(limit=1000)
    rig.clock.advance(2 * rig.lease_ttl)  # the sweeper's first look at each
    recovery.sweep(rt, probe=False)
    rig.drive(limit=1000)
    for run_id in templates:
        assert store.load(run_id).status is RunStatus.WAITING, store.load(run_id)
    for i, run_id in enumerate(templates):
        copies = waiting // len(templates) + (i < waiting % len(templates)) - 1
        if copies > 0:
            clone_run(store.engine, run_id, copies)
    if ended:
        done = create_run(rt, ENDED, "the ended template")
        rig.drive(limit=1000)
        assert store.load(done).status is RunStatus.COMPLETED
        clone_run(store.engine, done, ended - 1)
    vacuum = create_engine(store.engine.url, isolation_level="AUTOCOMMIT")
    with vacuum.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    vacuum.dispose()


def make_due(rig: Rig, count: int, tag: str = "") -> list[str]:
    """``count`` runs carried to a one-second wait, and the clock moved past it."""
    rt = rig.runtime()
    made = [create_run(rt, DUE, f"due {tag}{i}") for i in range(count)]
    rig.drive(limit=10_000)
    rig.clock.advance(2.0)
    return made
