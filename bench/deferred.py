"""``python -m bench.deferred``: what a run waiting on the world costs (issue 23).

RUNS runs of an agent whose tool defers (``harness.Deferred``: a callback,
a day's timeout) are carried to their wait by the real engine in this
process (tests.rig's runtime: no broker, no worker) on PostgreSQL, and
DUE more whose timeout is a second. Then:

- the rows and bytes a waiting run holds in each table (the tables' sizes,
  ``pg_total_relation_size``, indexes included, over the runs);
- what a sweep does while they wait: the waiting runs' query
  (``Store.due_waits``, median of ROUNDS) and one whole sweep
  (``engine.recovery.sweep``, which answers the DUE timeouts and wakes their
  runs), with RUNS waiting beside the DUE, against the same with only
  BASELINE waiting; and the buffers PostgreSQL read for the query
  (``EXPLAIN (ANALYZE, BUFFERS)``).

A measurement, not a test: it prints the figures and a ratio.

    python -m bench.deferred [--runs 10000] [--due 10] [--baseline 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine, text

import harness
from bench.common import fresh_postgres
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.store import schema
from harness.store.sql import SQLStore
from tests.rig import Rig

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench_deferred"
TABLES = ("harness_runs", "harness_steps", "harness_events", "harness_tool_results")
DAY = 86_400.0


@harness.tool(effect="idempotent")
def wait_for_courier(ctx: harness.ToolContext) -> harness.Deferred:
    """Ask a courier for a delivery; it answers later."""
    return harness.Deferred(timeout=DAY)


@harness.tool(effect="idempotent")
def wait_a_second(ctx: harness.ToolContext) -> harness.Deferred:
    return harness.Deferred(timeout=1.0)


def _agent(name: str, tool: Any) -> str:
    turns = [{"tool_calls": [{"name": tool.name, "args": {}}]}, {"final": "delivered"}]
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=[tool])
    )
    return name


LONG = _agent("bench-deferred-day", wait_for_courier)
SHORT = _agent("bench-deferred-second", wait_a_second)


@dataclass
class Waiting:
    runs: int
    rows: dict[str, float]  # per waiting run
    bytes: dict[str, float]  # per waiting run
    query_ms: float  # Store.due_waits, median
    sweep_ms: float  # one whole sweep answering the due timeouts
    buffers: int  # shared buffers the query read (hit + read)
    woke: int


def _sizes(url: str) -> tuple[dict[str, int], dict[str, int]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}
        size = {
            t: conn.execute(text(f"SELECT pg_total_relation_size('{t}')")).scalar_one()
            for t in TABLES
        }
    engine.dispose()
    return rows, size


def _buffers(url: str, now: float) -> int:
    engine = create_engine(url)
    query = schema.due_waits(now, 500).compile(
        dialect=engine.dialect, compile_kwargs={"literal_binds": True}
    )
    with engine.connect() as conn:
        plan = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}")).scalar_one()
    engine.dispose()
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def measure(runs: int, due: int, rounds: int = 20) -> Waiting:
    fresh_postgres(URL)
    store = SQLStore.from_url(URL)
    rig = Rig(store)
    rt = rig.runtime()
    before_rows, before_bytes = _sizes(URL)
    for n in range(runs):
        create_run(rt, LONG, f"parcel {n}")
        if len(rig.sent) >= 200:
            rig.drive(limit=10_000)
    rig.drive(limit=10_000_000)
    rows, size = _sizes(URL)
    per_row = {t: (rows[t] - before_rows[t]) / runs for t in TABLES}
    per_byte = {t: (size[t] - before_bytes[t]) / runs for t in TABLES}
    engine = create_engine(URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    for n in range(due):
        create_run(rt, SHORT, f"quick {n}")
    rig.drive(limit=10_000_000)
    rig.clock.advance(2.0)
    now = rig.clock.now()
    timings = []
    for _ in range(rounds):
        began = time.perf_counter()
        found = store.due_waits(now)
        timings.append((time.perf_counter() - began) * 1000)
    assert len(found) == due, (len(found), due)
    buffers = _buffers(URL, now)
    began = time.perf_counter()
    woke = len(recovery.sweep(rt, probe=False))
    sweep_ms = (time.perf_counter() - began) * 1000
    store.close()
    return Waiting(runs, per_row, per_byte, statistics.median(timings), sweep_ms, buffers, woke)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--due", type=int, default=10)
    parser.add_argument("--baseline", type=int, default=10)
    args = parser.parse_args()
    many = measure(args.runs, args.due)
    few = measure(args.baseline, args.due)
    print(f"a waiting run, of {many.runs}: rows and bytes in each table (indexes included)")
    for table in TABLES:
        print(f"  {table:22} {many.rows[table]:5.2f} rows  {many.bytes[table]:8.0f} B")
    total = sum(many.bytes.values())
    print(f"  {'total':22} {sum(many.rows.values()):5.2f} rows  {total:8.0f} B")
    print(f"sweep with {args.due} due: {many.runs} waiting vs {few.runs} waiting")
    print(
        f"  due_waits query  {many.query_ms:7.2f} ms vs {few.query_ms:7.2f} ms"
        f"  ({many.query_ms / few.query_ms:.1f}x); buffers {many.buffers} vs {few.buffers}"
    )
    print(
        f"  whole sweep      {many.sweep_ms:7.2f} ms vs {few.sweep_ms:7.2f} ms"
        f"  ({many.sweep_ms / few.sweep_ms:.1f}x); woke {many.woke} and {few.woke}"
    )


if __name__ == "__main__":
    main()
