"""The sweeper: recovery that does not depend on the broker.

Every ``HARNESS_SWEEP_INTERVAL`` seconds (Celery beat, or ``harness sweep``)
it finds runs that should be moving but are not, and sends each a fresh step
message:

* leased, but the lease expired: the owner died or hung mid-step;
* unleased, and no message processed it by ``wake_at``: the message was lost
  (a whole worker killed on the filesystem broker, a purged queue, a crash
  between the result checkpoint and the dispatch).

Each re-dispatch is a CAS that pushes ``wake_at`` forward, so a run whose
message is merely slow is re-sent once per lease TTL, not once per sweep, and
the duplicate is dropped by the runner's cursor and lease checks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from harness.engine.runner import SWEEPER, Runtime, commit
from harness.errors import StaleWriteError, StoreError
from harness.store import KEEP, Checkpoint, EventDraft, RunPatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Redispatched:
    run_id: str
    cursor: int
    reason: str


def sweep(rt: Runtime, limit: int = 500) -> list[Redispatched]:
    """Re-dispatch every stuck run; return what was sent."""
    now = rt.clock.now()
    sent: list[Redispatched] = []
    for run in rt.store.due_runs(now, limit):
        if run.owner is not None and run.owner != SWEEPER:
            reason = f"lease of {run.owner} expired {now - (run.lease_expires_at or now):.1f}s ago"
        else:
            reason = f"no step message processed {now - (run.wake_at or now):.1f}s after due"
        # An unleased run is marked as re-sent by the sweeper (an owner whose lease
        # has already lapsed): its next step then takes the careful path, RUNNING
        # checkpoint and counted attempt, even if the message comes in time.
        marked = run.owner is None
        try:
            commit(
                rt,
                Checkpoint(
                    run.run_id,
                    run.version,
                    SWEEPER,
                    now,
                    run=RunPatch(
                        wake_at=now + rt.lease_ttl,
                        owner=SWEEPER if marked else KEEP,
                        lease_expires_at=now if marked else KEEP,
                    ),
                    events=(EventDraft("redispatched", step_index=run.cursor, detail=reason),),
                ),
            )
        except StaleWriteError:
            continue  # it moved while we looked: not stuck
        except StoreError as err:  # e.g. its row is locked by a frozen process
            log.warning("run=%s sweeper skipped it this time: %s", run.run_id, err)
            continue
        try:
            rt.dispatch(run.run_id, run.cursor)
        except Exception as err:
            log.warning(
                "run=%s sweeper could not dispatch (%s); next sweep retries", run.run_id, err
            )
            continue
        sent.append(Redispatched(run.run_id, run.cursor, reason))
    return sent
