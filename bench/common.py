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
from pathlib import Path

import redis

from harness import api
from harness.worker.process import WorkerProcess

REPO = Path(__file__).resolve().parents[1]
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench"
REDIS_BROKER = "redis://127.0.0.1:6379/11"
REDIS_CACHE = "redis://127.0.0.1:6379/10"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"

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


class Setup:
    """One broker configuration with its own store; workers started on demand."""

    def __init__(self, broker: str, redis_cache: bool = True, **env: str) -> None:
        self.broker = broker
        self.home = Path(tempfile.mkdtemp(prefix=f"bench-{broker}-"))
        broker_url, database, cache = BROKERS[broker]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
        self.env |= {
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
