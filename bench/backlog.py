"""``python -m bench.backlog``: does a backlog feed itself? (issue 13, item 3)

RUNS runs (a model turn, one 100 ms tool call, a final turn) are queued at
once on one worker of SLOTS prefork processes, on Redis + PostgreSQL, with
a lease TTL of TTL seconds, so most messages wait in the queue far longer
than their run's wake-up time. Side by side, with the sweeper's delivery
probes off (every overdue run is re-sent) and on (harness.engine.probes):
the wall time, the sweeper's re-sends and the stale writes, per 1,000
steps. A measurement, not a test.

    python -m bench.backlog [RUNS] [SLOTS] [TTL]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from bench.common import Setup, wait
from harness import api
from harness.records import RunStatus


@dataclass(frozen=True)
class Backlog:
    probes: bool
    wall: float
    steps: int
    resent: int
    stale: int

    def row(self) -> str:
        per = 1000 / self.steps
        return (
            f"{'on' if self.probes else 'off':<7} {self.wall:>7.1f}s {self.steps:>6} "
            f"{self.resent:>9} {self.resent * per:>11.1f} {self.stale:>6} {self.stale * per:>10.1f}"
        )


def measure(runs: int, slots: int, ttl: float, probes: bool) -> Backlog:
    env = {
        "HARNESS_LEASE_TTL": str(ttl),
        "HARNESS_SWEEP_INTERVAL": "1",
        "HARNESS_DELIVERY_PROBES": "on" if probes else "off",
    }
    with Setup("redis", **env) as setup:
        setup.worker(f"--concurrency={slots}", "--pool=prefork")
        setup.beat()
        store = api.runtime().store
        if probes:  # a deployment that has been running: its lanes are known
            wait(
                lambda: (
                    len(store.lanes()) == 2
                    and all(lane.delivered_before for lane in store.lanes().values())
                ),
                what="the first probes",
            )
        started = time.time()
        ids = [api.start_run("bench-queued", f"run {i}") for i in range(runs)]
        finished = [api.wait_for(r, 900, poll=0.2) for r in ids]
        took = max(r.updated_at for r in finished) - started
        assert all(r.status is RunStatus.COMPLETED for r in finished)
        steps = sum(r.step_count for r in finished)
        stats = api.stats()
        resent, stale = stats["sweeper_redispatches"], stats["stale_writes_rejected"]
        return Backlog(probes, took, steps, int(resent), int(stale))


def main(runs: int, slots: int, ttl: float) -> None:
    print(f"{runs} runs queued at once on {slots} prefork slots, lease TTL {ttl:g}s (Redis + PG)")
    print(
        f"{'probes':<7} {'wall':>8} {'steps':>6} {'re-sends':>9} {'per 1k step':>11} "
        f"{'stale':>6} {'per 1k st.':>10}"
    )
    for probes in (False, True):
        print(measure(runs, slots, ttl, probes).row())


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
        int(sys.argv[2]) if len(sys.argv) > 2 else 8,
        float(sys.argv[3]) if len(sys.argv) > 3 else 5.0,
    )
