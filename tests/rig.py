"""An in-process runtime for driving the runner without Celery.

Dispatches are collected instead of sent, and time is a hand-moved clock, so
lease expiry and sweeps happen exactly when a test says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from harness.engine import transitions
from harness.engine.executor import Cache, NoCache
from harness.engine.hints import ClaimHint
from harness.engine.runner import run_step
from harness.engine.runtime import Runtime
from harness.engine.taskresult import TaskResult
from harness.records import Run
from harness.store import Store


def insert_run(store: Store, run_id: str, version: int = 0) -> Run:
    """A new run with its first step, straight into the store (no agent needed)."""
    run, steps = transitions.new_run(run_id, "agent", "goal", time.time())
    run = replace(run, version=version)
    created, inserted = store.create_run(run, steps, run.created_at, transitions.created(run))
    assert inserted
    return created


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Rig:
    store: Store
    clock: FakeClock = field(default_factory=FakeClock)
    cache: Cache = field(default_factory=NoCache)
    lease_ttl: float = 30.0
    sent: list[tuple[str, int]] = field(default_factory=list)
    resent: list[tuple[str, int]] = field(default_factory=list)  # on the recovery lane
    #: Messages sent with a delay: (due on the rig's clock, run_id, cursor).
    delayed: list[tuple[float, str, int]] = field(default_factory=list)
    drop_dispatches: bool = False
    #: The ClaimHint each message was sent with, delivered with it by drive().
    hints: dict[tuple[str, int], ClaimHint] = field(default_factory=dict)
    use_hints: bool = True
    #: More Runtime fields (``limiter``, ``prices``, ``crash``), as keywords.
    options: dict[str, Any] = field(default_factory=dict)

    def runtime(self, worker: str = "w1") -> Runtime:
        return Runtime(
            self.store, self.cache, self.clock, worker, self.lease_ttl, self._send, **self.options
        )

    def _send(
        self,
        run_id: str,
        cursor: int,
        *,
        recovery: bool = False,
        delay: float = 0.0,
        hint: ClaimHint | None = None,
    ) -> None:
        if self.drop_dispatches:
            raise ConnectionError("broker down")
        if hint is not None:
            self.hints[(run_id, cursor)] = hint
        if delay > 0:
            self.delayed.append((self.clock.now() + delay, run_id, cursor))
            return
        self.sent.append((run_id, cursor))
        if recovery:
            self.resent.append((run_id, cursor))

    def drive(self, worker: str = "w1", limit: int = 200) -> list[TaskResult]:
        """Deliver queued messages, oldest first, until none is left."""
        outcomes = []
        rt = self.runtime(worker)
        while (self.sent or self.delayed) and len(outcomes) < limit:
            if not self.sent:  # only delayed ones left: let the clock reach the first
                self.delayed.sort()
                due, run_id, cursor = self.delayed.pop(0)
                self.clock.t = max(self.clock.t, due)
                self.sent.append((run_id, cursor))
            run_id, cursor = self.sent.pop(0)
            hint = self.hints.pop((run_id, cursor), None) if self.use_hints else None
            outcomes.append(run_step(rt, run_id, cursor, hint))
        return outcomes

    def load(self, run_id: str) -> Run:
        return self.store.load(run_id)
