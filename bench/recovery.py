"""Recovery time after SIGKILL of a whole worker in the middle of a tool call.

    python -m bench.recovery --broker redis --kills 5 --ttl 2 --sweep 0.5
    python -m bench.recovery --broker filesystem --kills 5

Two workers and one beat run; each round starts a run whose tool takes 3 s,
SIGKILLs the worker executing it, and measures from the kill until the other
worker starts the same step again (the ledger shows a second start) and
until the run completes. Recovery is bounded by lease TTL + sweep interval.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import redis

from harness import api
from harness.workerproc import WorkerProcess

REPO = Path(__file__).resolve().parents[1]
BROKERS = {
    "redis": (
        "redis://127.0.0.1:6379/11",
        "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench",
    ),
    "filesystem": ("filesystem://", None),
}


def _starts(ledger: Path) -> list[tuple[str, int, float]]:
    if not ledger.exists():
        return []
    rows = [line.split() for line in ledger.read_text().splitlines()]
    return [(key, int(pid), float(at)) for key, pid, at in rows]


def _wait(check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.01)


def _fresh_postgres(url: str) -> None:
    from sqlalchemy import create_engine, text

    from harness.migrate import upgrade
    from harness.sqlstore import make_engine

    base, name = url.rsplit("/", 1)
    admin = create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    upgrade(make_engine(url))


def measure(broker: str, kills: int, ttl: float, sweep: float) -> list[tuple[float, float]]:
    home = Path(tempfile.mkdtemp(prefix=f"bench-recovery-{broker}-"))
    broker_url, pg = BROKERS[broker]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env |= {
        "HARNESS_BROKER_URL": broker_url,
        "HARNESS_DATABASE_URL": pg or f"sqlite:///{home / 'harness.db'}",
        "HARNESS_HOME": str(home),
        "HARNESS_IMPORTS": "bench.agents",
        "HARNESS_LEASE_TTL": str(ttl),
        "HARNESS_SWEEP_INTERVAL": str(sweep),
        "BENCH_LEDGER": str(home / "ledger.txt"),
        "PYTHONPATH": str(REPO),
    }
    if broker == "redis":
        redis.Redis.from_url(broker_url).flushdb()
        env["HARNESS_REDIS_URL"] = "redis://127.0.0.1:6379/10"
    os.environ.update(env)
    api.reset_runtime()
    if pg:
        _fresh_postgres(pg)
    procs = [WorkerProcess("beat", env, home, beat=True).wait_ready()]
    workers = [WorkerProcess(f"w{i}", env, home).wait_ready() for i in range(2)]
    ledger = home / "ledger.txt"
    results = []
    try:
        for n in range(kills):
            run_id = api.start_run("bench-slow-tool", f"round {n}")
            key = f"{run_id}:1"
            _wait(lambda: any(k == key for k, _, _ in _starts(ledger)))
            pid = next(p for k, p, _ in _starts(ledger) if k == key)
            victim = next(w for w in workers if pid in (w.pid, *w.children()))
            victim.kill()
            killed = time.time()
            _wait(lambda: sum(k == key for k, _, _ in _starts(ledger)) == 2)
            restarted = max(at for k, _, at in _starts(ledger) if k == key)
            run = api.wait_for(run_id, 60)
            assert run.status == "completed", run
            results.append((restarted - killed, time.time() - killed))
            print(
                f"  kill {n + 1}: step re-started {restarted - killed:.2f}s after the kill, "
                f"run completed after {results[-1][1]:.2f}s",
                flush=True,
            )
            workers.remove(victim)
            workers.append(WorkerProcess(f"w{n + 2}", env, home).wait_ready())
    finally:
        for proc in procs + workers:
            proc.kill()
        shutil.rmtree(home, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=sorted(BROKERS), default="filesystem")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--sweep", type=float, default=0.5)
    args = parser.parse_args()
    print(
        f"{args.broker}: lease TTL {args.ttl}s, sweep every {args.sweep}s, "
        f"bound {args.ttl + args.sweep}s"
    )
    results = measure(args.broker, args.kills, args.ttl, args.sweep)
    restart = [r for r, _ in results]
    print(
        f"{args.broker}: recovery (kill -> step re-started) over {len(restart)} kills: "
        f"median {statistics.median(restart):.2f}s, max {max(restart):.2f}s "
        f"(bound TTL + sweep = {args.ttl + args.sweep:.1f}s)"
    )


if __name__ == "__main__":
    main()
