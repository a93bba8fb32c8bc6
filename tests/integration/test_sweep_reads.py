"""Runs that wait cost a sweep nothing (issue 26, goal 5), on PostgreSQL.

A sweep's reads must follow the runs that are due, not those deferred,
sleeping, awaiting approval or blocked (re-sent, the next re-send far
off). Ten due runs are swept beside 1,000 such runs: the rows PostgreSQL
examines for the sweep's queries (``EXPLAIN ANALYZE``: rows returned and
rows filtered out by every scan) are the due runs alone;
the statements the sweep sends are as many as beside 10 waiting runs (and
990 ended, so that the tables are alike); and the sweep still wakes every
due run. Before the index on ``wake_minute`` (migration 0019) the waiting
runs' query read 1,010 rows (all 910 waiting runs: the planner scanned the
table), and the movable runs' query the 100 blocked ones (status index).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.sql import Select

import harness
from harness.engine import creation, probes, recovery, transitions
from harness.records import RunStatus
from harness.store import Delivered, schema
from harness.store.sql import SQLStore
from tests import sweep_world as world
from tests.rig import Rig

DUE = 10


@dataclass(frozen=True)
class Reads:
    examined: dict[str, int]  # query -> rows its scans returned or filtered out
    statements: int  # sent by one whole sweep
    woken: set[str]
    due: set[str]


def _scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "Relation Name" in plan:
        yield plan
    for child in plan.get("Plans", ()):
        yield from _scans(child)


def _examined(engine: Engine, query: Select[Any]) -> int:
    """Rows the scans of ``query`` returned or threw away, as PostgreSQL ran it."""
    sql = query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True})
    with engine.connect() as conn:
        plan = conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")).scalar_one()
    total = 0
    for scan in _scans(plan[0]["Plan"]):
        per_loop = (
            scan["Actual Rows"]
            + scan.get("Rows Removed by Filter", 0)
            + scan.get("Rows Removed by Index Recheck", 0)
        )
        total += per_loop * scan["Actual Loops"]
    return int(total)


def _sweep_reads(url: str, waiting: int, ended: int, blocked: int = 0) -> Reads:
    store = SQLStore.from_url(url)
    try:
        store.reset()
        rig = Rig(store)
        world.seed(rig, store, waiting, ended, blocked)
        due = set(world.make_due(rig, DUE))
        now = rig.clock.now()
        # As with delivery probes on both lanes: the query in its fullest shape.
        last_probe = now - rig.lease_ttl
        delivered = Delivered(
            transitions.SWEEPER,
            oldest=now - probes.PATIENCE * rig.lease_ttl,
            normal=last_probe,
            recovery=last_probe,
        )
        queries = {
            "due_runs": schema.due_runs(now, 500, delivered),
            "due_waits": schema.due_waits(now, 500),
            "stranded_inboxes": schema.stranded_inboxes(now - rig.lease_ttl, 500),
        }
        examined = {name: _examined(store.engine, q) for name, q in queries.items()}
        sent = [0]

        def count(*_: object) -> None:
            sent[0] += 1

        event.listen(store.engine, "before_cursor_execute", count)
        woken = {r.run_id for r in recovery.sweep(rig.runtime(), probe=False)}
        event.remove(store.engine, "before_cursor_execute", count)
        rig.drive(limit=10_000)
        for run_id in due:
            assert store.load(run_id).status is RunStatus.COMPLETED, store.load(run_id)
        return Reads(examined, sent[0], woken, due)
    finally:
        store.close()


def test_a_sweep_reads_the_due_runs_not_the_waiting_ones(postgres_url: str) -> None:
    # 900 waiting a day on the world or an operator, 100 no worker carries
    # (their next re-send 32 lease TTLs away): 1,000 runs the sweep leaves be.
    many = _sweep_reads(postgres_url, waiting=900, ended=0, blocked=100)
    few = _sweep_reads(postgres_url, waiting=10, ended=990)
    assert many.woken == many.due and few.woken == few.due  # every due run recovered
    # The ten due runs, nothing of the 1,000 (each query by its status and minute).
    assert many.examined == {"due_runs": 0, "due_waits": DUE, "stranded_inboxes": 0}
    assert many.statements == few.statements


STEPS = 60


@harness.tool(effect="idempotent")
def sr_step(n: int) -> int:
    return n


harness.register_agent(
    harness.Agent(
        name="sr-stepper",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "sr_step", "args": {"n": n}}]} for n in range(STEPS)]
            + [{"final": "done"}]
        ),
        tools=[sr_step],
        max_steps=2 * STEPS + 1,
    )
)


def _run_row_updates(engine: Engine, at_least: int) -> tuple[int, int]:
    """(updates, heap-only updates) of harness_runs, once the closed sessions'
    statistics have arrived (a backend sends them as it exits)."""
    deadline = time.monotonic() + 30
    with engine.connect() as conn:
        while True:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            row: Any = conn.execute(
                text(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                    " WHERE relname = 'harness_runs'"
                )
            ).one()
            if row.n_tup_upd >= at_least or time.monotonic() > deadline:
                return int(row.n_tup_upd), int(row.n_tup_hot_upd)
            time.sleep(0.1)


def test_run_rows_stay_heap_only_beside_the_wake_minute_index(postgres_url: str) -> None:
    """Every checkpoint moves ``wake_at``; its minute, which the sweeper's
    index holds, moves once a minute at most, so a run's updates stay
    heap-only but for those (and the changes of status, which the status
    index holds). A second a step: 121 steps cross two or three minutes."""
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    store = SQLStore.from_url(postgres_url)
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_stat_reset()"))
        rig = Rig(store)
        creation.create_run(rig.runtime(), "sr-stepper", "goal", run_id="stepper")
        while rig.sent:
            rig.clock.advance(1.0)
            rig.drive(limit=1)
        assert store.load("stepper").status is RunStatus.COMPLETED
        store.close()  # its sessions end, and send their statistics
        updates, hot = _run_row_updates(admin, at_least=2 * STEPS)
        assert updates >= 2 * STEPS
        assert hot >= 0.9 * updates, (updates, hot)
    finally:
        store.close()
        admin.dispose()
