"""``python -m bench.waiting``: a thousand runs waiting on their model (issue 13, item 1).

RUNS runs are started at once. Each makes two model calls to a local server that
speaks the OpenAI wire format (tests.wire, through the real ``openai`` SDK) and
answers each after LATENCY seconds, with a no-op tool step between them. The
workers are WORKERS processes of Celery's threads pool, THREADS threads each, on
Redis + PostgreSQL. The ideal wall time is every call's latency divided over
the threads (RUNS x 2 x LATENCY / (WORKERS x THREADS)); the figure is the ideal
over the measured time. Sampled meanwhile, once a second: the workers' memory
(RSS, all processes), the database's connections, and at the end the sweeper's
re-sends, stale writes and lease takeovers. A measurement, not a test.

    python -m bench.waiting [RUNS] [THREADS] [WORKERS] [LATENCY]
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

from bench.common import PG_URL, Setup, wait
from bench.cpu import cpu_seconds
from harness import api
from harness.celery.process import WorkerProcess
from harness.records import RunStatus
from tests.wire import WireServer

TURNS = 2  # model calls per run


@dataclass
class Waiting:
    runs: int
    threads: int
    workers: int
    latency: float
    wall: float
    ideal: float
    steps: int
    rss_mb: float  # the workers' peak, all their processes
    idle_rss_mb: float  # before the runs started
    connections: int  # peak, to the benchmark database
    resent: int
    stale: int
    takeovers: int
    cpu_s: float = 0.0  # the workers' CPU time over the runs, all their processes

    @property
    def cpu_ms_per_call(self) -> float:
        """The workers' CPU per model call: the call's step, and its share of
        the tool step and of the run's start and end. A process (one GIL)
        carries at most 1000 / this many calls a second."""
        return self.cpu_s * 1000 / (self.runs * TURNS)

    @property
    def efficiency(self) -> float:
        return self.ideal / self.wall

    @property
    def kb_per_run(self) -> float:
        """Memory added per run in flight (the peak holds min(runs, threads) of them)."""
        in_flight = min(self.runs, self.threads * self.workers)
        return (self.rss_mb - self.idle_rss_mb) * 1024 / in_flight


def _rss_mb(procs: list[WorkerProcess]) -> float:
    """The resident memory of the workers, main processes and pool children."""
    total = 0
    for proc in procs:
        for pid in [proc.pid, *proc.children()]:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
    return total / 1024


def _cpu_s(procs: list[WorkerProcess]) -> float:
    """The CPU time the workers have used, main processes and pool children."""
    total = 0.0
    for proc in procs:
        for pid in [proc.pid, *proc.children()]:
            with contextlib.suppress(OSError):  # a child replaced meanwhile
                total += cpu_seconds(pid)
    return total


class Sampler(threading.Thread):
    """Once a second: the workers' RSS and the database's connections, keeping the peaks."""

    def __init__(self, procs: list[WorkerProcess]) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.rss_mb = 0.0
        self.connections = 0
        self._done = threading.Event()
        base, name = PG_URL.rsplit("/", 1)
        self._name = name
        self._engine = create_engine(f"{base}/postgres", pool_size=1)

    def sample(self) -> None:
        self.rss_mb = max(self.rss_mb, _rss_mb(self.procs))
        with self._engine.connect() as conn:
            count = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"),
                {"d": self._name},
            ).scalar_one()
        self.connections = max(self.connections, int(count))

    def run(self) -> None:
        while not self._done.wait(1.0):
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.join()
        self._engine.dispose()


def measure(runs: int, threads: int, workers: int, latency: float) -> Waiting:
    wire = WireServer(
        default=[
            {"tool_calls": [{"name": "noop", "args": {"i": 1}}], "faults": [{"delay": latency}]},
            {"text": "done", "faults": [{"delay": latency}]},
        ]
    ).start()
    env = {
        "OPENAI_BASE_URL": wire.openai_base_url,
        "OPENAI_API_KEY": "bench-key",
        "HARNESS_SWEEP_INTERVAL": "5",  # beat's default: a deployment as it runs
    }
    try:
        with Setup("redis", **env) as setup:
            procs = setup.workers(workers, ("--pool=threads", f"--concurrency={threads}"))
            setup.beat()
            store = api.runtime().store
            wait(  # a deployment that has been running: the sweeper knows its lanes
                lambda: (
                    len(store.lanes()) == 2
                    and all(lane.delivered_before for lane in store.lanes().values())
                ),
                what="the first delivery probes",
            )
            idle = _rss_mb(procs)
            cpu = _cpu_s(procs)
            sampler = Sampler(procs)
            sampler.start()
            started = time.time()
            ids = [api.start_run("bench-remote", f"run {i}") for i in range(runs)]
            finished = api.wait_all(ids, 900, poll=0.5)
            cpu = _cpu_s(procs) - cpu
            sampler.stop()
            bad = [r for r in finished if r.status is not RunStatus.COMPLETED]
            assert not bad, f"{len(bad)} runs did not complete: {bad[0].status} {bad[0].error}"
            wall = max(r.updated_at for r in finished) - started
            stats = api.stats()
            return Waiting(
                runs=runs,
                threads=threads,
                workers=workers,
                latency=latency,
                wall=wall,
                ideal=runs * TURNS * latency / (threads * workers),
                steps=sum(r.step_count for r in finished),
                rss_mb=sampler.rss_mb,
                idle_rss_mb=idle,
                connections=sampler.connections,
                resent=int(stats["sweeper_redispatches"]),
                stale=int(stats["stale_writes_rejected"]),
                takeovers=int(stats["lease_takeovers"]),
                cpu_s=cpu,
            )
    finally:
        wire.stop()


HEADER = (
    f"{'runs':>5} {'threads':>7} {'workers':>7} {'wall':>7} {'ideal':>6} {'of ideal':>8} "
    f"{'RSS MB':>7} {'KB/run':>7} {'PG conns':>8} {'re-sends':>8} {'stale':>5} {'takeovers':>9} "
    f"{'CPU ms/call':>11}"
)


def row(w: Waiting) -> str:
    return (
        f"{w.runs:>5} {w.threads:>7} {w.workers:>7} {w.wall:>6.1f}s {w.ideal:>5.1f}s "
        f"{w.efficiency:>7.0%} {w.rss_mb:>7.0f} {w.kb_per_run:>7.0f} {w.connections:>8} "
        f"{w.resent:>8} {w.stale:>5} {w.takeovers:>9} {w.cpu_ms_per_call:>11.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=int, default=1000)
    parser.add_argument("threads", nargs="?", type=int, default=100)
    parser.add_argument("workers", nargs="?", type=int, default=2)
    parser.add_argument("latency", nargs="?", type=float, default=1.0)
    args = parser.parse_args()
    print(HEADER)
    print(row(measure(args.runs, args.threads, args.workers, args.latency)), flush=True)


if __name__ == "__main__":
    main()
