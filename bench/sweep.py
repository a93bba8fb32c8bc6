"""``python -m bench.sweep``: a sweep's work with 10,000 runs waiting (issue 26, goal 5).

"10,000 waiting runs cost nothing while they wait": a sweep's database work
should follow the runs that are due, not those deferred, sleeping or
awaiting approval. Three runs, one of each kind, are carried to their wait
by the real engine in this process (tests.rig's runtime: no broker, no
worker) on PostgreSQL and given the sweeper's first look; then they are
cloned until WAITING runs wait, a third of each kind, their waits a day
long (tests.sweep_world). Each round then carries DUE runs to a wait
of one second, moves the clock past it, and times one whole sweep
(``engine.recovery.sweep``), which answers those timeouts and wakes the runs.

Beside the time (median of ROUNDS; and of its two queries for runs to
move, ``Store.due_runs`` and ``Store.due_waits``, median of 20 a round,
less noisy on a busy machine), what PostgreSQL itself counted for the
sweep: rows read from the tables (``seq_tup_read + idx_tup_fetch`` of
``pg_stat_user_tables``), buffers touched (``pg_statio_user_tables``, heap
and index, hit or read) and statements sent. Counters are flushed when a
backend exits, so the store's connections are closed around each sweep.
The same is measured with BASELINE runs waiting, and the ratios printed.
A measurement, not a test.

    python -m bench.sweep [--waiting 10000] [--due 10] [--baseline 10] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine, event, text

from bench.common import PG_URL, fresh_postgres
from harness.engine import recovery
from harness.store.sql import SQLStore
from tests import sweep_world as world
from tests.rig import Rig

URL = f"{PG_URL}_sweep_runs"
#: Times the sweep's two queries are timed in each round (they change nothing).
QUERY_ROUNDS = 20


@dataclass
class SweepWork:
    waiting: int
    ended: int
    due: int
    sweep_ms: float  # one whole sweep, median
    queries_ms: float  # its two queries for runs to move (due_runs, due_waits), median
    rows: float  # rows read from the tables by one sweep, median
    buffers: float  # buffers touched, median
    statements: float  # statements sent, median
    woke: int  # runs woken by the last sweep


def _counters(admin: Engine, name: str) -> tuple[int, int]:
    """Rows read and buffers touched in the database so far, once every other
    backend on it has exited (and so flushed its counters)."""
    with admin.connect() as conn:
        deadline = time.monotonic() + 10
        others = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
        )
        while conn.execute(text(others), {"d": name}).scalar_one() and time.monotonic() < deadline:
            time.sleep(0.01)
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        rows = conn.execute(
            text("SELECT sum(seq_tup_read + coalesce(idx_tup_fetch, 0)) FROM pg_stat_user_tables")
        ).scalar_one()
        buffers = conn.execute(
            text(
                "SELECT sum(coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)"
                " + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)"
                " + coalesce(toast_blks_hit, 0) + coalesce(toast_blks_read, 0)"
                " + coalesce(tidx_blks_hit, 0) + coalesce(tidx_blks_read, 0))"
                " FROM pg_statio_user_tables"
            )
        ).scalar_one()
    return int(rows or 0), int(buffers or 0)


def measure(waiting: int, due: int, rounds: int = 7, ended: int = 0) -> SweepWork:
    """One sweep's work with ``waiting`` runs waiting, ``ended`` completed
    and ``due`` due, median of ``rounds``."""
    fresh_postgres(URL)
    store = SQLStore.from_url(URL)
    rig = Rig(store)
    rt = rig.runtime()
    world.seed(rig, store, waiting, ended)
    sent = [0]
    event.listen(store.engine, "before_cursor_execute", lambda *_: sent.__setitem__(0, sent[0] + 1))
    admin = create_engine(URL, isolation_level="AUTOCOMMIT")
    name = URL.rsplit("/", 1)[1]
    times, queries, rows, buffers, statements = [], [], [], [], []
    woke = 0
    for r in range(rounds):
        world.make_due(rig, due, f"{r}.")
        now = rig.clock.now()
        for _ in range(QUERY_ROUNDS):
            began = time.perf_counter()
            store.due_runs(now)
            store.due_waits(now)
            queries.append((time.perf_counter() - began) * 1000)
        store.close()
        before = _counters(admin, name)
        store.ping()  # a connection ready, as a sweeper's pool has one
        first = sent[0]
        began = time.perf_counter()
        woke = len(recovery.sweep(rt, probe=False))
        times.append((time.perf_counter() - began) * 1000)
        statements.append(sent[0] - first)
        store.close()
        after = _counters(admin, name)
        rows.append(after[0] - before[0])
        buffers.append(after[1] - before[1])
        assert woke == due, (woke, due)
        rig.drive(limit=10_000)  # the woken runs end
    admin.dispose()
    store.close()
    return SweepWork(
        waiting,
        ended,
        due,
        statistics.median(times),
        statistics.median(queries),
        statistics.median(rows),
        statistics.median(buffers),
        statistics.median(statements),
        woke,
    )


def report(many: SweepWork, few: SweepWork) -> list[str]:
    """The figures side by side, with their ratios."""
    more = f" (+ {few.ended} ended)" if few.ended else ""
    lines = [
        f"one sweep with {many.due} due: {many.waiting} waiting vs {few.waiting}{more} waiting"
    ]
    for label, a, b, unit in (
        ("whole sweep (median)", many.sweep_ms, few.sweep_ms, "ms"),
        ("its two due queries", many.queries_ms, few.queries_ms, "ms"),
        ("rows read", many.rows, few.rows, "rows"),
        ("buffers touched", many.buffers, few.buffers, "buffers"),
        ("statements", many.statements, few.statements, "statements"),
    ):
        lines.append(f"  {label:22} {a:9.2f} vs {b:9.2f} {unit:10} {a / b if b else 0:6.2f}x")
    return lines


#: Issue 26's goal 5, as the suite's goal column says it.
GOAL = "~1x: waiting costs nothing"


def suite_rows(
    waiting: int, due: int = 10, baseline: int = 10, rounds: int = 5
) -> list[tuple[str, float, str, float, str, str]]:
    """``make bench``'s rows (bench.suite.Row's fields): the sweep's time
    against the same with ``baseline`` runs waiting, and its rows read
    against the same with as many runs in the tables, ended instead of
    waiting (tiny tables are scanned whole: rows read are alike only then)."""
    many = measure(waiting, due, rounds)
    few = measure(baseline, due, rounds)
    padded = measure(baseline, due, rounds, ended=waiting - baseline)
    print("\n".join(report(many, few) + report(many, padded)), flush=True)
    return [
        (
            f"one sweep, {due} due, {waiting} runs waiting vs {baseline}",
            many.sweep_ms,
            "ms",
            few.sweep_ms,
            GOAL,
            f"(median of {rounds}; its two due queries {many.queries_ms:.2f} ms vs "
            f"{few.queries_ms:.2f}; {many.statements:.0f} statements vs {few.statements:.0f})",
        ),
        (
            f"rows one sweep reads, {waiting} waiting vs {baseline} + {waiting - baseline} ended",
            many.rows,
            "rows",
            padded.rows,
            GOAL,
            f"(buffers {many.buffers:.0f} vs {padded.buffers:.0f})",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--due", type=int, default=10)
    parser.add_argument("--baseline", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    many = measure(args.waiting, args.due, args.rounds)
    few = measure(args.baseline, args.due, args.rounds)
    print("\n".join(report(many, few)))
    # The same number of runs in the tables: only whether they wait differs.
    padded = measure(args.baseline, args.due, args.rounds, ended=args.waiting - args.baseline)
    print("\n".join(report(many, padded)))


if __name__ == "__main__":
    main()
