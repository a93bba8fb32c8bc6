"""``python -m bench.archive``: an export's size against the run's rows (issue 12).

Carries a run of TOOL_CALLS tool calls (2 x TOOL_CALLS + 1 steps) through the
runner in-process on a fresh PostgreSQL database of its own, then compares
the bytes of its export (indented, compact, compact gzipped) with the bytes
of its rows as PostgreSQL stores them (``sum(pg_column_size(row))`` over the
run, step, event and tool record rows: tuple data, no index entries, no page
overhead), and times an export and an import. A measurement, not a test.

    python -m bench.archive [TOOL_CALLS ...]
"""

from __future__ import annotations

import gzip
import sys
import time
from typing import Any

from sqlalchemy import text

import harness
from bench.common import fresh_postgres
from harness.engine.creation import create_run
from harness.runs import archive
from harness.store import schema
from harness.store.sql import SQLStore
from tests.rig import Rig

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench_archive"


@harness.tool(effect="idempotent")
def lookup(order: str, ctx: harness.ToolContext) -> dict[str, Any]:
    """A small, realistic tool result (an order record)."""
    return {
        "order": order,
        "status": "shipped",
        "items": [{"sku": f"SKU-{n:04}", "qty": n % 3 + 1, "price": 9.99 + n} for n in range(3)],
        "key": ctx.idempotency_key,
    }


def agent(calls: int) -> str:
    name = f"bench-archive-{calls}"
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "lookup", "args": {"order": f"order {i:05}"}}]}
        for i in range(calls)
    ]
    turns.append({"final": f"looked up {calls} orders"})
    model = harness.ScriptedModel(turns)
    harness.register_agent(
        harness.Agent(name=name, model=model, tools=[lookup], max_steps=2 * calls + 5)
    )
    return name


def row_bytes(store: SQLStore, run_id: str) -> dict[str, int]:
    sizes = {}
    with store.engine.connect() as conn:
        for table in (schema.runs, schema.steps, schema.events, schema.tool_results):
            sql = (
                f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table.name} t "
                "WHERE run_id = :r"
            )
            sizes[table.name] = int(conn.execute(text(sql), {"r": run_id}).scalar_one())
    return sizes


def measure(store: SQLStore, calls: int) -> None:
    rig = Rig(store)
    run_id = create_run(rig.runtime(), agent(calls), "look them up", f"archive-{calls}")
    rig.drive(limit=10 * calls + 10)
    assert store.load(run_id).status == "completed"
    rows = row_bytes(store, run_id)
    started = time.perf_counter()
    document = archive.export_run(store, run_id)
    exported = time.perf_counter() - started
    indented, compact = archive.dumps(document), archive.dumps(document, compact=True)
    zipped = gzip.compress(compact)
    store.reset()
    started = time.perf_counter()
    assert archive.import_run(store, indented).imported
    imported = time.perf_counter() - started
    total = sum(rows.values())
    counts = document["manifest"]["counts"]
    print(
        f"{counts['steps']} steps, {counts['events']} events, {counts['tool_records']} tool records"
    )
    print(f"  rows in PostgreSQL: {total:,} bytes {rows}")
    for label, size in (("indented", indented), ("compact", compact), ("compact gz", zipped)):
        print(f"  export {label:10}: {len(size):,} bytes = {len(size) / total:.2f} x the rows")
    print(
        f"  export {exported * 1000:.0f} ms, "
        f"import (validate + one transaction) {imported * 1000:.0f} ms"
    )


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [150, 500]
    fresh_postgres(PG_URL)
    store = SQLStore.from_url(PG_URL)
    try:
        for calls in sizes:
            measure(store, calls)
    finally:
        store.close()


if __name__ == "__main__":
    main()
