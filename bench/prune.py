"""``python -m bench.prune``: the prune rate (issue 12's closing figure).

Seeds RUNS finished runs of STEPS steps each (a tool record per tool step,
two events per step) aged 40 days, plus runs a prune must keep (recent,
moving, and a fork ancestor of a recent fork), into a fresh PostgreSQL
database of its own (and a SQLite file), then times ``prune --older-than
30d`` in batches of 100: runs and rows deleted per second, and the longest
batch (about the longest any lock is held). A measurement, not a test.

    python -m bench.prune [RUNS] [STEPS]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench.common import fresh_postgres
from harness.runs.prune import describe, prune
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore, make_engine
from tests.seeding import DAY, Seed, row_counts, seed

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench_prune"
STATUSES = ("completed", "completed", "failed", "cancelled")


def seeds(runs: int, steps: int) -> list[Seed]:
    old = [Seed(f"old-{i:06}", STATUSES[i % 4], steps=steps) for i in range(runs)]
    kept = [
        *(Seed(f"new-{i}", age=DAY, steps=steps) for i in range(50)),
        *(Seed(f"moving-{i}", "running", steps=steps) for i in range(50)),
        Seed("fork-of-old", forked_from="old-000000", age=DAY, steps=steps),
    ]
    return old + kept


def measure(url: str, runs: int, steps: int) -> None:
    engine = make_engine(url)
    upgrade(engine)
    now = time.time()
    started = time.perf_counter()
    all_seeds = seeds(runs, steps)
    for i in range(0, len(all_seeds), 200):
        seed(engine, all_seeds[i : i + 200], now)
    if engine.dialect.name == "postgresql":
        # Statistics, as autovacuum keeps them on a live store: without them,
        # freshly bulk-loaded tables get scan plans (measured: 3x slower).
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
    before = row_counts(engine)
    print(f"  seeded {before} in {time.perf_counter() - started:.1f}s")
    store = SQLStore(engine)
    dry = prune(store, 30 * DAY, now, dry_run=True)
    print(f"  dry run: {dry.seconds:.2f}s; " + describe(dry)[0])
    report = prune(store, 30 * DAY, now)
    for line in describe(report):
        print(f"  {line}")
    after = row_counts(engine)
    deleted = sum(before.values()) - sum(after.values())
    assert deleted == report.row_count, (deleted, report.row_count)
    print(
        f"  prune rate: {report.run_count / report.seconds:,.0f} runs/s, "
        f"{report.row_count / report.seconds:,.0f} rows/s; left {after}"
    )
    store.close()


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    print(f"PostgreSQL, {runs} runs of {steps} steps:")
    fresh_postgres(PG_URL)
    measure(PG_URL, runs, steps)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"SQLite (WAL), {runs} runs of {steps} steps:")
        measure(f"sqlite:///{Path(tmp) / 'harness.db'}", runs, steps)


if __name__ == "__main__":
    main()
