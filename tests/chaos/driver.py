"""A chaos driver: runs with side effects while workers are SIGKILLed at random.

It kills pool children (prefork) or whole workers, mostly ones executing a
tool call, starts replacements, and then checks the external ledger:

* every run completed, every child run it started too, and every tool step
  is done (none skipped);
* every effect in the ledger belongs to a real tool step (no phantom);
* a step started again only if its previous executor was killed;
* no two executions of one step overlapped.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import api
from harness.celery.process import WorkerProcess
from harness.engine import waits
from harness.errors import DecisionConflict
from tests.cluster import Cluster
from tests.ledger import killed_after
from tests.wait_agents import callback_urls

#: Runs that wait on the world, started beside the chaos runs (tests/wait_agents.py,
#: whose HARNESS_IMPORTS and secret the cluster needs): one defers until the
#: courier calls back, one until the signal ``paid``, one sleeps 2 s, and one
#: hands two tasks to child runs.
WAITING = ("w-courier", "w-payer", "w-napper", "w-planner")
#: Agents from the ecosystem, started beside them too (tests/mcp_agents.py,
#: tests/pydantic_agents.py): a run whose tools are MCP servers' (the reference
#: time server from PyPI, and ours), and a Pydantic AI agent whose tools write
#: the ledger from the worker, as the chaos runs' do.
ECOSYSTEM = ("mcp-chaos", "pai-weather")
#: The tools of :data:`ECOSYSTEM` that write no ledger: checked done, not counted.
UNLEDGERED = frozenset({"clock_get_current_time", "weather"})


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
    callbacks: int = 0
    signals: int = 0
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
        self._answered: set[str] = set()  # callback tokens posted, runs signalled
        self._payers: list[str] = []
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

    def answer(self) -> None:
        """Play the world the waiting runs wait on: call back on every URL the
        courier handed out, and send each payer its signal, once each, however
        early (an answer to a call still under way is kept until it defers)."""
        rt = api.runtime()
        for _, url in callback_urls(self.c.ledger_path):
            token = url.rsplit("/", 1)[1]
            if token in self._answered:
                continue
            try:
                waits.callback(rt, token, {"tracking": token[-8:]}, None)
            except DecisionConflict:  # not a call that takes answers yet: next time
                continue
            self._answered.add(token)
            self.report.callbacks += 1
        for run_id in self._payers:
            if run_id in self._answered:
                continue
            with contextlib.suppress(DecisionConflict):  # it ended otherwise: verify says
                waits.signal(rt, run_id, "paid", {"amount": 1}, signal_id=f"tx-{run_id}")
                self.report.signals += 1
            self._answered.add(run_id)

    def run(
        self,
        runs: int,
        kill_every: tuple[float, float],
        max_seconds: float,
        also: Sequence[str] = (),
    ) -> None:
        """Start ``runs`` chaos runs and one run of each agent in ``also`` (say
        :data:`WAITING`), and kill at random until they are done (or time is up)."""
        run_ids = self.c.start("chaos", count=runs)
        waiting = [(agent, api.start_run(agent, f"goal {agent}")) for agent in also]
        run_ids += [run_id for _, run_id in waiting]
        self._payers += [run_id for agent, run_id in waiting if agent == "w-payer"]
        self.run_ids += run_ids

        def ended() -> bool:
            self.answer()
            return all(api.get_run(r).status.terminal for r in run_ids)

        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            if ended():
                break
            time.sleep(self.rng.uniform(*kill_every))  # pacing of the kills
            self.kill_one()
        deadline = time.monotonic() + 120
        while not ended():
            assert time.monotonic() < deadline, f"runs still moving after 120s\n{self.c.logs()}"
            time.sleep(0.2)

    def verify(self) -> ChaosReport:
        """Check every run started so far against the ledger; fill in the report."""
        ledger = self.c.assert_completed_once(self.run_ids, unledgered=UNLEDGERED)
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
