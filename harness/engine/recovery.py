"""The sweeper: recovery that does not depend on the broker.

Every ``HARNESS_SWEEP_INTERVAL`` seconds (Celery beat, or ``harness sweep``)
it finds runs that should be moving but are not, and sends each a fresh step
message:

* leased, but the lease expired: the owner died or hung mid-step;
* unleased, and no message processed it by ``wake_at``: the message was lost
  (a whole worker killed on the filesystem broker, a purged queue, a crash
  between the result checkpoint and the dispatch).

Each re-dispatch is a CAS that pushes ``wake_at`` forward (one TTL, then
doubling while the run does not move: see ``transitions.redispatch``), so a
run whose message is merely slow is not re-sent at every sweep, and one that
no worker can carry is not re-sent forever at full rate. The duplicate is
dropped by the runner's cursor and lease checks. Re-sends go out on the
recovery lane of the sender, which may put them ahead of a backlog.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from harness.engine import transitions
from harness.engine.runner import Runtime, commit, dispatch
from harness.errors import StaleWriteError, StoreError

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
        checkpoint = transitions.redispatch(run, now=now, ttl=rt.lease_ttl)
        try:
            commit(rt, checkpoint)
        except StaleWriteError:
            continue  # it moved while we looked: not stuck
        except StoreError as err:  # e.g. its row is locked by a frozen process
            log.warning("run=%s sweeper skipped it this time: %s", run.run_id, err)
            continue
        if dispatch(rt, run.run_id, run.cursor, recovery=True):
            reason = checkpoint.events[0].detail or ""
            sent.append(Redispatched(run.run_id, run.cursor, reason))
    return sent
