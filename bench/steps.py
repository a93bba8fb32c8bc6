"""Milliseconds per step against milliseconds per bare Celery hop, same worker.

    python -m bench.steps --broker redis --steps 2000

The baseline is ``bench.hop``: a no-op task on the same app, broker and
worker that sends itself again. A harness step does that hop plus its
durable writes, so the ratio shows what durability costs over the floor.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from celery import Celery

from bench.common import BROKERS, FLOOR_TABLE, Setup, wait
from harness import api
from harness.celery.config import celery_settings
from harness.records import RunStatus, Step
from harness.settings import Settings


def client() -> Celery:
    """A sender for the benchmark's own configuration."""
    app = Celery("bench-client", set_as_current=False)
    app.conf.update(celery_settings(Settings.from_env()))
    return app


def bare_hops(setup: Setup, hops: int, chains: int = 1) -> float:
    """Wall milliseconds per hop over ``chains`` concurrent chains of ``hops`` hops."""
    sender = client()
    done = [setup.home / f"hops-{time.monotonic_ns()}-{c}" for c in range(chains)]
    start = time.time()
    for path in done:
        sender.send_task("bench.hop", (hops, str(path)))
    wait(lambda: all(p.exists() for p in done), what="the hop chains")
    end = max(float(p.read_text()) for p in done)
    return (end - start) * 1000 / (hops * chains)


def floor_hops(setup: Setup, hops: int, chains: int = 1, task: str = "bench.floor_hop") -> float:
    """Wall milliseconds per hop of ``task`` over ``chains`` chains of ``hops``:
    ``bench.floor_hop`` (a hop with a ``bench-loop`` step's round trips) or
    ``bench.fast_floor_hop`` (a hop with one SELECT and one CAS UPDATE)."""
    url = setup.env["HARNESS_DATABASE_URL"].replace("+psycopg", "")
    names = [f"c{time.monotonic_ns()}-{c}" for c in range(chains)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (chain text PRIMARY KEY, v int)")
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {FLOOR_TABLE} VALUES (%s, 0)", [(n,) for n in names])
    sender = client()
    done = [setup.home / f"floor-{name}" for name in names]
    start = time.time()
    for name, path in zip(names, done, strict=True):
        sender.send_task(task, (hops, str(path), name))
    wait(lambda: all(p.exists() for p in done), what="the floor chains")
    end = max(float(p.read_text()) for p in done)
    return (end - start) * 1000 / (hops * chains)


@dataclass(frozen=True)
class Timed:
    ms_per_step: float
    steps: list[Step]


def harness_steps(agent: str, steps: int, runs: int = 1) -> Timed:
    """Wall milliseconds per step over ``runs`` concurrent runs of ``steps`` steps."""
    ids = [api.start_run(agent, f"steps {steps}") for _ in range(runs)]
    finished = [api.wait_for(r, 600, poll=0.05) for r in ids]
    for run in finished:
        if run.status is not RunStatus.COMPLETED:
            raise RuntimeError(f"benchmark run {run.run_id} ended {run.status}: {run.error}")
    start = min(r.created_at for r in finished)
    end = max(r.updated_at for r in finished)
    total = sum(r.step_count for r in finished)
    return Timed((end - start) * 1000 / total, api.get_steps(ids[0]))


def window_ms(steps: list[Step], first: int, width: int = 100) -> float:
    """Milliseconds per step over ``width`` steps from index ``first``."""
    done = [s.finished_at for s in steps[first : first + width + 1]]
    assert all(t is not None for t in done), "every step of a completed run is finished"
    return (done[-1] - done[0]) * 1000 / width  # type: ignore[operator]


def best(measure: Callable[[], float], repeat: int) -> float:
    """The median of ``repeat`` measurements."""
    return statistics.median(measure() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=sorted(BROKERS), default="redis")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--agent", default="bench-loop")
    parser.add_argument("--pool", default="")
    args = parser.parse_args()
    extra = ("-P", args.pool) if args.pool else ()
    with Setup(args.broker) as setup:
        setup.worker(*extra)
        bare_hops(setup, 200)  # warm up
        hop = best(lambda: bare_hops(setup, args.steps), args.repeat)
        harness_steps(args.agent, 201)
        step = best(lambda: harness_steps(args.agent, args.steps).ms_per_step, args.repeat)
    print(
        f"{args.broker}: bare hop {hop:.3f} ms, harness step {step:.3f} ms, ratio {step / hop:.2f}x"
    )


if __name__ == "__main__":
    main()
