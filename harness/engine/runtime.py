"""The runtime: everything the engine depends on, injected, and the two
acts every engine module shares (commit a checkpoint, send a step message).

Apart from the runner so that the modules the runner calls (steps, gates,
billing) and the ones beside it (operations, recovery, fork, replay) can
name the runtime without importing the runner: the engine's imports point
one way. A composition root builds one (harness.compose) and passes it down.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from harness import faults, observability
from harness.clock import Clock
from harness.engine.executor import Cache, StepExecutor
from harness.engine.hints import ClaimHint
from harness.engine.transcripts import TranscriptCache
from harness.providers.prices import Prices
from harness.providers.ratelimit import RateLimiter
from harness.store import Checkpoint, Store
from harness.streams import Sink

log = logging.getLogger(__name__)


class Sender(Protocol):
    """Puts one step message on the broker; ``recovery`` (a re-send by the
    sweeper) takes the recovery lane; ``delay``: deliver it no sooner than
    that many seconds from now; ``hint``: the state of the run, for the next
    worker to claim the step on. The Celery layer provides it."""

    def __call__(
        self,
        run_id: str,
        cursor: int,
        *,
        recovery: bool = False,
        delay: float = 0.0,
        hint: ClaimHint | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class Runtime:
    """Everything the runner depends on, injected."""

    store: Store
    cache: Cache
    clock: Clock
    worker_id: str
    lease_ttl: float
    dispatch: Sender
    #: A step running longer than this stops renewing its lease, so another
    #: worker can take the run over even where Celery cannot kill the step.
    step_time_limit: float = 900.0
    crash: faults.CrashPoints = faults.NEVER
    #: Throughput mode starts another step in the same task only this many
    #: seconds into it (the task's time limit allows for it: see Settings).
    chain_budget: float = 60.0
    #: Lease renewals go through this store (its own connections, so a busy
    #: pool of step threads cannot starve them); the main store if None.
    heartbeat_store: Store | None = None
    #: Executes tool calls and records model responses under their steps'
    #: idempotency keys; None: one on ``store`` and ``cache``. A replay's calls
    #: go through a Cassette around it.
    step_executor: StepExecutor | None = None
    #: Provider rate limits shared through Redis (HARNESS_RATE_LIMITS).
    limiter: RateLimiter | None = None
    #: What a model turn costs (HARNESS_PRICES).
    prices: Prices = field(default_factory=Prices)
    #: The sweeper sends delivery probes, and re-sends an overdue run only
    #: once a probe sent after its message has come through the queue, or
    #: PATIENCE TTLs past its wake-up (harness.engine.probes).
    probes: bool = False
    #: Signs the callback URLs of deferred calls (HARNESS_CALLBACK_SECRET);
    #: None: a tool asking for one gets a ConfigError.
    callback_secret: str | None = None
    #: Where those URLs point (HARNESS_PUBLIC_URL).
    public_url: str = "http://127.0.0.1:8000"
    #: Where a model call's text is published as it comes (harness.streams);
    #: None: nowhere.
    streams: Sink | None = None
    #: The settled steps of the conversations this process carries, so a model
    #: turn reads only the steps after them (harness.engine.transcripts); None:
    #: every turn reads its run whole.
    transcripts: TranscriptCache | None = field(default_factory=TranscriptCache)

    @functools.cached_property
    def executor(self) -> StepExecutor:
        """What executes this runtime's tool calls and records its model responses."""
        return self.step_executor or StepExecutor(
            self.store, self.cache, self.lease_ttl, self.crash
        )


def commit(
    rt: Runtime, checkpoint: Checkpoint, kind: str | None = None, started_at: float | None = None
) -> int:
    """Apply a checkpoint, then log each of its transitions (one line each on
    ``harness.transitions``) and measure it (harness.observability).
    ``kind``: the step's, when the checkpoint is about the step this task
    executes; ``started_at``: that step's claim, once it has executed."""
    began = time.perf_counter()
    version = rt.store.checkpoint(checkpoint)
    write = time.perf_counter() - began
    duration = None if started_at is None else rt.clock.now() - started_at
    # Never raises: the write has landed (harness.observability).
    observability.committed(checkpoint, version, kind=kind, duration=duration, write=write)
    return version


def dispatch(
    rt: Runtime,
    run_id: str,
    cursor: int,
    recovery: bool = False,
    delay: float = 0.0,
    hint: ClaimHint | None = None,
) -> bool:
    """Send the step message; False if it could not be sent (the sweeper
    re-sends it after ``wake_at``)."""
    try:
        rt.dispatch(run_id, cursor, recovery=recovery, delay=delay, hint=hint)
    except Exception as err:
        log.warning(
            "run=%s step=%d dispatch failed (%s); the sweeper will resume it", run_id, cursor, err
        )
        return False
    return True
