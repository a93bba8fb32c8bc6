"""Seed finished (or any) runs straight into a store's tables, with chosen ages.

A prune is about old runs, and no test can wait a month: these rows are what
a worker would have written (steps alternating model and tool, a tool record
per tool step keyed ``"{run_id}:{idx}"``, two events per step), inserted in
bulk with the schema's own tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, String, cast, func, insert, select, true

from harness.store import RunRows, schema
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore

DAY = 86400.0


@dataclass(frozen=True)
class Seed:
    """One run to insert; ``age``: seconds since its last update."""

    run_id: str
    status: str = "completed"
    age: float = 40 * DAY
    #: Seconds since creation (default: ``age``).
    created_age: float | None = None
    steps: int = 4
    forked_from: str | None = None


def _rows(seed: Seed, now: float) -> dict[str, list[dict[str, Any]]]:
    created = now - (seed.age if seed.created_age is None else seed.created_age)
    updated = now - seed.age
    run = {
        "run_id": seed.run_id,
        "agent": "chain",
        "goal": f"seeded {seed.run_id}",
        "status": seed.status,
        "cursor": seed.steps - 1,
        "version": 2 * seed.steps + 1,
        "step_count": seed.steps,
        "created_at": created,
        "updated_at": updated,
        "result": "done" if seed.status == "completed" else None,
        "forked_from_run": seed.forked_from,
        "forked_from_step": None if seed.forked_from is None else 0,
    }
    steps, events, records = [], [], []
    for idx in range(seed.steps):
        tool = idx % 2 == 1
        steps.append(
            {
                "run_id": seed.run_id,
                "idx": idx,
                "kind": "tool" if tool else "model",
                "status": "done",
                "attempts": 1,
                "tool": "effect" if tool else None,
                "args": json.dumps({"n": idx}),
                "result": json.dumps({"n": idx}),
                "started_at": created,
                "finished_at": created,
            }
        )
        for to in ("running", "done"):
            events.append(
                {
                    "run_id": seed.run_id,
                    "version": len(events) + 1,
                    "step_index": idx,
                    "to_status": to,
                    "at": created,
                }
            )
        if tool:
            records.append(
                {
                    "key": f"{seed.run_id}:{idx}",
                    "run_id": seed.run_id,
                    "step_index": idx,
                    "tool": "effect",
                    "result": json.dumps({"n": idx}),
                    "created_at": created,
                }
            )
    return {"runs": [run], "steps": steps, "events": events, "tool_results": records}


def seed(target: Engine | SQLStore | MemoryStore, seeds: Iterable[Seed], now: float) -> None:
    """Insert the runs in one transaction (an in-memory store: each run as an import)."""
    if isinstance(target, MemoryStore):
        for s in seeds:
            target.import_run(_run_rows(_rows(s, now)))
        return
    engine = target.engine if isinstance(target, SQLStore) else target
    tables = {
        "runs": schema.runs,
        "steps": schema.steps,
        "events": schema.events,
        "tool_results": schema.tool_results,
    }
    batch: dict[str, list[dict[str, Any]]] = {name: [] for name in tables}
    for s in seeds:
        for name, rows in _rows(s, now).items():
            batch[name] += rows
    # One real transaction (the store's engines autocommit, or BEGIN only on its cue).
    options: dict[str, Any] = {"harness_write": True}
    if engine.dialect.name == "postgresql":
        options["isolation_level"] = "READ COMMITTED"
    with engine.connect() as conn:
        conn = conn.execution_options(**options)
        with conn.begin():
            for name, table in tables.items():
                if batch[name]:
                    conn.execute(table.insert(), batch[name])


def expected_rows(seed: Seed) -> dict[str, int]:
    """The rows :func:`seed` writes for one run, by table."""
    return {
        "runs": 1,
        "steps": seed.steps,
        "events": 2 * seed.steps,
        "tool_records": seed.steps // 2,
    }


def row_counts(
    target: Engine | SQLStore | MemoryStore, run_id: str | None = None
) -> dict[str, int]:
    """Rows per table, of one run or of all."""
    if isinstance(target, MemoryStore):
        return _memory_counts(target, run_id)
    engine = target.engine if isinstance(target, SQLStore) else target
    counts: dict[str, int] = {}
    for name, table in (
        ("runs", schema.runs),
        ("steps", schema.steps),
        ("events", schema.events),
        ("tool_records", schema.tool_results),
    ):
        query = select(func.count()).select_from(table)
        if run_id is not None:
            query = query.where(table.c.run_id == run_id)
        with engine.connect() as conn:
            counts[name] = int(conn.execute(query).scalar_one())
    return counts


def _run_rows(rows: dict[str, list[dict[str, Any]]]) -> RunRows:
    """:func:`_rows` as an import takes them: JSON columns as values."""

    def decoded(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
        return {**row, **{c: json.loads(row[c]) for c in columns if row.get(c) is not None}}

    return RunRows(
        rows["runs"][0],
        tuple(decoded(r, ("args", "result")) for r in rows["steps"]),
        tuple(rows["events"]),
        tuple(decoded(r, ("result",)) for r in rows["tool_results"]),
    )


def _memory_counts(store: MemoryStore, run_id: str | None) -> dict[str, int]:
    sizes = store.table_sizes(run_id)
    return {
        "runs": sizes["harness_runs"],
        "steps": sizes["harness_steps"],
        "events": sizes["harness_events"],
        "tool_records": sizes["harness_tool_results"],
    }


def clone_run(engine: Engine, run_id: str, copies: int) -> list[str]:
    """PostgreSQL: ``copies`` copies of a run's rows (run, steps, events, tool
    records, tools offered), under the ids ``{run_id}~{n}``, in one statement
    per table. A run carried to its wait by the real engine, then cloned, puts
    thousands of runs in exactly the state a worker leaves them in, in
    seconds rather than the minutes of carrying each one."""
    n = func.generate_series(1, copies).table_valued("n").render_derived(name="copy")
    made = {}
    for table in (schema.runs, schema.steps, schema.events, schema.tool_results, schema.run_tools):
        new_id = table.c.run_id + "~" + cast(n.c.n, String)
        values: dict[str, Any] = {}
        for column in table.c:
            if column.computed is not None or (table is schema.events and column.name == "id"):
                continue  # made by the database
            values[column.name] = column
        values["run_id"] = new_id
        if table is schema.tool_results:
            values["key"] = new_id + ":" + cast(table.c.step_index, String)
        source = (
            select(*(v.label(k) for k, v in values.items()))
            .select_from(table.join(n, true()))
            .where(table.c.run_id == run_id)
        )
        made[table.name] = insert(table).from_select(list(values), source)
    with engine.begin() as conn:
        for statement in made.values():
            conn.execute(statement)
    return [f"{run_id}~{i}" for i in range(1, copies + 1)]
