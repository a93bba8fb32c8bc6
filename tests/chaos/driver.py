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
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import api
from harness.records import RunStatus, StepKind, StepStatus
from harness.workerproc import WorkerProcess
from tests.cluster import Cluster


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
        self.killed: dict[int, float] = {}  # pid -> when it was killed
        self.in_flight_at_kill: list[tuple[str, float]] = []
        self.report = ChaosReport(broker)
        self.run_ids: list[str] = []
        self._started = time.monotonic()
        cluster.beat()
        for _ in range(workers):
            self._add_worker()

    def _add_worker(self) -> None:
        extra = ("--concurrency=2",) if self.prefork else ()
        self.workers.append(self.c.worker(*extra))

    def _in_flight(self) -> dict[str, int]:
        ledger = self.c.ledger()
        return {
            key: starts[-1][0]
            for key, starts in ledger.starts.items()
            if len(starts) > len(ledger.ends.get(key, []))
        }

    def kill_one(self) -> None:
        """Kill an executor mid-call when there is one, else a random worker."""
        in_flight = self._in_flight()
        now = time.time()
        if in_flight and self.rng.random() < 0.8:
            key, pid = self.rng.choice(sorted(in_flight.items()))
            owner = next((w for w in self.workers if pid in (w.pid, *w.children())), None)
            if owner is None:
                return
            self.report.kills_mid_call += 1
            self.in_flight_at_kill.append((key, now))
            if self.prefork and self.rng.random() < 0.5:
                os.kill(pid, signal.SIGKILL)
                self.killed[pid] = now
                self.report.child_kills += 1
                return
            victim = owner
        else:
            victim = self.rng.choice(self.workers)
        for pid in (victim.pid, *victim.children()):
            self.killed[pid] = now
        victim.kill()
        self.workers.remove(victim)
        self.report.worker_kills += 1
        self._add_worker()

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
        ledger = self.c.ledger()
        tool_keys = set()
        for run_id in self.run_ids:
            run = api.get_run(run_id)
            assert run.status is RunStatus.COMPLETED, f"{run}\n{self.c.logs()}"
            for step in api.get_steps(run_id):
                if step.kind is StepKind.TOOL:
                    assert step.status is StepStatus.DONE, step
                    tool_keys.add(step.idempotency_key)
                    assert ledger.effects(step.idempotency_key) >= 1, f"{step} skipped"
        phantoms = set(ledger.starts) - tool_keys
        assert not phantoms, f"effects for steps that do not exist: {phantoms}"
        for key, starts in ledger.starts.items():
            ordered = sorted(starts, key=lambda s: s[1])
            for pid, _ in ordered[:-1]:
                assert pid in self.killed, f"{key} re-executed though pid {pid} was not killed"
            self.report.re_executions += len(ordered) - 1
            self.report.duplicate_effects += max(0, ledger.effects(key) - 1)
        assert ledger.overlapping() == [], "two executions of one step at the same time"
        for key, killed_at in self.in_flight_at_kill:
            later = [at for _, at in ledger.starts[key] if at > killed_at]
            if later:
                self.report.recovery_seconds.append(min(later) - killed_at)
        self.report.runs = len(self.run_ids)
        self.report.tool_steps = len(tool_keys)
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
