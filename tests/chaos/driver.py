"""A chaos driver: runs with side effects while workers are SIGKILLed at random.

It kills pool children (prefork) or whole workers, mostly ones executing a
tool call, starts replacements, and then checks the external ledger:

* every run completed and every tool step is done (none skipped);
* every effect in the ledger belongs to a real tool step (no phantom);
* a step started again only if its previous executor was killed;
* no two executions of one step overlapped.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import api
from harness.celery.process import WorkerProcess
from tests.cluster import Cluster
from tests.ledger import killed_after


@dataclass
class ChaosReport:
    broker: str
    runs: int = 0
    tool_steps: int = 0
    child_kills: int = 0
    worker_kills: int = 0
    kills_mid_call: int = 0
    re_executions: int = 0
    duplicate_effects: int = 0
    recovery_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, object]:
        data = asdict(self)
        times = data.pop("recovery_seconds")
        data["recovery_median_s"] = round(statistics.median(times), 2) if times else None
        data["recovery_max_s"] = round(max(times), 2) if times else None
        return data


class Chaos:
    def __init__(self, cluster: Cluster, broker: str, workers: int = 2, seed: int = 0) -> None:
        self.c = cluster
        self.broker = broker
        self.rng = random.Random(seed)
        self.prefork = broker != "filesystem"
        self.workers: list[WorkerProcess] = []
        self.cut_off: list[tuple[str, float]] = []  # (key, kill time) of calls killed mid-way
        self._seen: set[tuple[str, float]] = set()
        self.report = ChaosReport(broker)
        self.run_ids: list[str] = []
        self._started = time.monotonic()
        cluster.beat()
        for _ in range(workers):
            self._add_worker()

    def _add_worker(self) -> None:
        extra = ("--concurrency=2",) if self.prefork else ()
        self.workers.append(self.c.worker(*extra))

    def _owner(self, pid: int) -> WorkerProcess | None:
        return next((w for w in self.workers if pid in (w.pid, *w.children())), None)

    def kill_one(self) -> None:
        """Kill an executor mid-call when there is one, else a random worker."""
        under_way = self.c.ledger().unfinished(self.c.killed)
        victim: WorkerProcess | None = None
        if under_way and self.rng.random() < 0.8:
            _, pid = self.rng.choice(sorted(under_way.items()))
            victim = self._owner(pid)
            child = victim is not None and self.prefork and pid != victim.pid
            if child and self.rng.random() < 0.5:
                self.c.kill_pid(pid)
                self.report.child_kills += 1
                self._note_cut_off()
                return
        if victim is None:
            victim = self.rng.choice(self.workers)
        self.c.kill(victim)
        self.workers.remove(victim)
        self.report.worker_kills += 1
        self._note_cut_off()
        self._add_worker()

    def _note_cut_off(self) -> None:
        """Record the calls that the last kill cut off, with the kill time."""
        for e in self.c.ledger().executions:
            kill = killed_after(self.c.killed, e.pid, e.start)
            if e.end is None and kill is not None and (e.key, e.start) not in self._seen:
                self.cut_off.append((e.key, kill))
                self._seen.add((e.key, e.start))

    def run(self, runs: int, kill_every: tuple[float, float], max_seconds: float) -> None:
        """Start ``runs`` runs and kill at random until they are done (or time is up)."""
        run_ids = self.c.start("chaos", count=runs)
        self.run_ids += run_ids
        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            if all(api.get_run(r).status.terminal for r in run_ids):
                break
            time.sleep(self.rng.uniform(*kill_every))  # pacing of the kills
            self.kill_one()
        self.c.wait_all(run_ids, timeout=120)

    def verify(self) -> ChaosReport:
        """Check every run started so far against the ledger; fill in the report."""
        ledger = self.c.assert_completed_once(self.run_ids)
        for calls in ledger.by_key.values():
            self.report.re_executions += len(calls) - 1
            self.report.duplicate_effects += max(0, sum(e.end is not None for e in calls) - 1)
        for key, killed_at in self.cut_off:
            later = [e.start for e in ledger.by_key[key] if e.start > killed_at]
            if later:
                self.report.recovery_seconds.append(min(later) - killed_at)
        self.report.kills_mid_call = len(self.cut_off)
        self.report.runs = len(self.run_ids)
        self.report.tool_steps = len(ledger.by_key)
        self.report.seconds = round(time.monotonic() - self._started, 1)
        return self.report


def write_report(report: ChaosReport) -> None:
    """Append the report to $HARNESS_TEST_CHAOS_REPORT (JSON lines), if set."""
    path = os.environ.get("HARNESS_TEST_CHAOS_REPORT")
    line = json.dumps(report.summary())
    print(line)
    if path:
        with Path(path).open("a") as f:
            f.write(line + "\n")
