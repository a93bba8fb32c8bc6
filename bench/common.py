"""What every benchmark shares: one configuration per broker, real workers.

A :class:`Setup` is a fresh store (a new PostgreSQL database, or a new SQLite
file), an emptied broker, the environment for ``celery -A tasks worker``
subprocesses, and the in-process API pointed at the same configuration.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import redis
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.pool import NullPool

from harness import api
from harness.celery.process import WorkerProcess
from harness.engine import creation
from harness.records import RunStatus
from harness.runs import fork as forks
from harness.store import schema

REPO = Path(__file__).resolve().parents[1]
#: The benchmarks' database, Redis and RabbitMQ; each can be moved by a variable,
#: so that two benchmarks on one machine (or a benchmark beside the tests) use
#: their own: ``BENCH_PG_URL``, ``BENCH_REDIS`` (a server's URL without a
#: database number), or ``BENCH_REDIS_BROKER`` / ``BENCH_REDIS_CACHE`` whole,
#: and ``BENCH_RABBITMQ``.
PG_URL = os.environ.get(
    "BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench"
)
_REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
REDIS_BROKER = os.environ.get("BENCH_REDIS_BROKER", f"{_REDIS}/11")
REDIS_CACHE = os.environ.get("BENCH_REDIS_CACHE", f"{_REDIS}/10")
RABBITMQ = os.environ.get("BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
#: The table of ``bench.floor_hop`` (bench.agents), made by the benchmark before it sends.
FLOOR_TABLE = "bench_floor"

#: broker name -> (broker URL, database URL or None for SQLite, Redis cache URL)
BROKERS: dict[str, tuple[str, str | None, str | None]] = {
    "redis": (REDIS_BROKER, PG_URL, REDIS_CACHE),
    "rabbitmq": (RABBITMQ, PG_URL, REDIS_CACHE),
    "filesystem": ("filesystem://", None, None),
}


def wait(check: Callable[[], object], timeout: float = 120, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout}s")
        time.sleep(0.005)


def fresh_postgres(url: str) -> None:
    """Drop and re-create the benchmark database, then migrate it."""
    from sqlalchemy import create_engine, text

    from harness.store.migrate import upgrade
    from harness.store.sql import make_engine

    base, name = url.rsplit("/", 1)
    admin = create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()


def purge_broker(url: str) -> None:
    if url.startswith("redis://"):
        redis.Redis.from_url(url).flushdb()
    elif url.startswith("amqp://"):
        from kombu import Connection

        # An exception here: the queue does not exist yet.
        with contextlib.suppress(Exception), Connection(url) as conn, conn.channel() as channel:
            channel.queue_purge("harness")


#: The sweep interval of a Setup that names none, seconds: no sweep in a benchmark's time.
UNSWEPT = 3600


class Setup:
    """One broker configuration with its own store; workers started on demand."""

    def __init__(self, broker: str, redis_cache: bool = True, **env: str) -> None:
        self.broker = broker
        self.home = Path(tempfile.mkdtemp(prefix=f"bench-{broker}-"))
        broker_url, database, cache = BROKERS[broker]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
        self.env |= {
            # Most benchmarks run no beat, and the workers take the sweep over
            # 15 s after they start (harness.celery.takeover): the runs a Batch
            # holds back would be re-sent before their release, mid-seeding.
            # Those measuring sweeps or recovery set their own interval.
            "HARNESS_SWEEP_INTERVAL": str(UNSWEPT),
            "HARNESS_BROKER_URL": broker_url,
            "HARNESS_DATABASE_URL": database or f"sqlite:///{self.home / 'harness.db'}",
            "HARNESS_HOME": str(self.home),
            "HARNESS_IMPORTS": "bench.agents",
            "BENCH_LEDGER": str(self.home / "ledger.txt"),
            "PYTHONPATH": str(REPO),
        }
        if cache and redis_cache:
            redis.Redis.from_url(cache).flushdb()
            self.env["HARNESS_REDIS_URL"] = cache
        self.env |= env
        purge_broker(broker_url)
        if database:
            fresh_postgres(database)
        os.environ.update(self.env)
        for name in [k for k in os.environ if k.startswith("HARNESS_") and k not in self.env]:
            del os.environ[name]
        api.reset_runtime()
        api.runtime()  # migrates the SQLite store before any worker starts
        api.ensure_agents()  # the in-process benchmarks create runs of bench.agents
        self.processes: list[WorkerProcess] = []

    def worker(self, *extra: str) -> WorkerProcess:
        proc = WorkerProcess(f"w{len(self.processes)}", self.env, self.home, extra=extra)
        self.processes.append(proc)
        return proc.wait_ready(60)

    def workers(self, count: int, extra: Sequence[str] = ()) -> list[WorkerProcess]:
        return [self.worker(*extra) for _ in range(count)]

    def beat(self) -> WorkerProcess:
        proc = WorkerProcess("beat", self.env, self.home, beat=True)
        self.processes.append(proc)
        return proc.wait_ready(60)

    def stop_workers(self) -> None:
        for proc in self.processes:
            proc.kill()
        self.processes.clear()

    def close(self) -> None:
        self.stop_workers()
        api.reset_runtime()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> Setup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Batch:
    """Runs created (or forked) with their first step messages held back, then
    released together: every run is in the queue when the clock starts, and
    creating them takes no CPU from the workers during the measurement."""

    def __init__(self) -> None:
        self.live = api.runtime()
        self.held: list[tuple[str, int]] = []
        self.rt = replace(self.live, dispatch=self._hold)

    def _hold(self, run_id: str, cursor: int, **_: object) -> None:
        self.held.append((run_id, cursor))

    def start(self, agent: str, goal: str) -> str:
        return creation.create_run(self.rt, agent, goal)

    def fork(self, origin: str, at: int, goal: str) -> str:
        return forks.fork_run(self.rt, origin, at, goal=goal)

    def clone(self, run_id: str, count: int) -> list[str]:
        """``count`` copies of ``run_id``, a run created or forked here and not
        released yet, with their messages held like its own: its rows copied by
        PostgreSQL, one INSERT ... SELECT per table, where ``api.fork_run``
        writes a fork's rows from Python (2 s and more for a 10,000-step run).
        Seeding only: the copies are then executed like any run."""
        cursor = next(c for r, c in self.held if r == run_id)
        ids = [f"{run_id}-{n}" for n in range(count)]
        copy_runs(self.live.store.engine, run_id, ids)  # type: ignore[attr-defined]
        self.held.extend((i, cursor) for i in ids)
        return ids

    def release(self) -> dict[str, float]:
        """Send every held message; when each run's was sent."""
        sent = {}
        for run_id, cursor in self.held:
            sent[run_id] = time.time()
            self.live.dispatch(run_id, cursor)
        self.held.clear()
        return sent


def copy_runs(engine: Engine, run_id: str, ids: Sequence[str]) -> None:
    """Copies of ``run_id`` under ``ids`` as they stand: its run row, steps,
    events and tool records, copied by PostgreSQL, one INSERT ... SELECT per
    table, each copy's idempotency keys renamed with it. Seeding only: each
    copy is then carried on like any run."""
    new_id = "new.run_id"
    renamed = {
        "run_id": new_id,
        "key": f"{new_id} || substr(t.key, {len(run_id) + 1})",  # "{run_id}:{step}"
    }
    with engine.begin() as conn:
        for table in (schema.runs, schema.steps, schema.events, schema.tool_results):
            columns = [
                c.name
                for c in table.columns
                if c.autoincrement is not True
                and c.computed is None  # wake_minute: by the database
            ]
            values = [renamed.get(c, f"t.{c}") for c in columns]
            conn.execute(
                text(
                    f"INSERT INTO {table.name} ({', '.join(columns)}) "
                    f"SELECT {', '.join(values)} FROM {table.name} t, "
                    "unnest(CAST(:ids AS text[])) AS new(run_id) WHERE t.run_id = :origin"
                ),
                {"ids": list(ids), "origin": run_id},
            )


#: Run statuses a benchmark waits for: ended, or held for an operator.
SETTLED = [s.value for s in RunStatus if s.terminal or s.held]


class Poller:
    """Counts settled runs with one query on one connection (``api.wait_all``
    would load every run on every poll, a load as large as the one measured);
    ``queries`` says how many transactions it added to the database's count."""

    def __init__(self, url: str = PG_URL) -> None:
        self.engine = create_engine(url, pool_size=1, isolation_level="AUTOCOMMIT")
        self.queries = 0

    def settled(self) -> int:
        self.queries += 1
        runs = schema.runs
        query = select(runs.c.status, text("count(*)")).group_by(runs.c.status)
        with self.engine.connect() as conn:
            counts = dict(conn.execute(query).tuples().all())
        return sum(n for status, n in counts.items() if status in SETTLED)

    def wait(self, count: int, timeout: float, poll: float = 0.25) -> None:
        """Until ``count`` runs of the database have settled."""
        deadline = time.monotonic() + timeout
        while self.settled() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} runs settled after {timeout}s")
            time.sleep(poll)

    def close(self) -> None:
        self.engine.dispose()


def finish_times(run_ids: Sequence[str], first: int = 0) -> dict[str, list[float]]:
    """Each run's steps' ``finished_at`` from step ``first`` on, in order, read
    in one query per thousand runs; a run that did not complete raises."""
    steps, runs = schema.steps, schema.runs
    engine = api.runtime().store.engine  # type: ignore[attr-defined]
    done: dict[str, list[float]] = {r: [] for r in run_ids}
    with engine.connect() as conn:
        for i in range(0, len(run_ids), 1000):
            chunk = list(run_ids[i : i + 1000])
            bad = conn.execute(
                select(runs.c.run_id, runs.c.status, runs.c.error).where(
                    runs.c.run_id.in_(chunk), runs.c.status != RunStatus.COMPLETED.value
                )
            ).first()
            if bad is not None:
                raise RuntimeError(f"benchmark run {bad[0]} ended {bad[1]}: {bad[2]}")
            rows = conn.execute(
                select(steps.c.run_id, steps.c.finished_at)
                .where(steps.c.run_id.in_(chunk), steps.c.idx >= first)
                .order_by(steps.c.run_id, steps.c.idx)
            )
            for run_id, finished in rows:
                done[run_id].append(finished)
    return done


def pg_transactions(url: str = PG_URL) -> int:
    """The database's committed and rolled-back transactions so far, counting
    every session's: waits until each session has ended or been idle for 11 s,
    since a session reports its counts only when it ends or has been idle for
    a while (at most 10 s on PostgreSQL 15)."""
    base, name = url.rsplit("/", 1)
    admin = create_engine(f"{base}/postgres", poolclass=NullPool)
    busy = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = :d "
        "AND backend_type = 'client backend' "
        "AND (state <> 'idle' OR state_change > now() - interval '11 seconds')"
    )
    counted = text("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :d")
    try:
        deadline = time.monotonic() + 60
        with admin.connect() as conn:
            while conn.execute(busy, {"d": name}).scalar_one():
                if time.monotonic() > deadline:
                    raise TimeoutError("sessions of the benchmark database still busy after 60s")
                conn.rollback()  # a new snapshot of the activity view
                time.sleep(0.2)
            conn.rollback()
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            return int(conn.execute(counted, {"d": name}).scalar_one())
    finally:
        admin.dispose()
