"""What the sweeper writes of a run that should be moving but is not: a
re-send (:func:`redispatch`), spaced out exponentially (:func:`resend_delay`),
and, once, why no worker could carry it (:func:`block`)."""

from __future__ import annotations

from harness.engine.transitions.owners import BACKED_OFF, LAPSED, RESCHEDULED, SWEEPER
from harness.records import Run
from harness.store import KEEP, Checkpoint, EventDraft, RunPatch

#: Re-sends of a run that does not move wait TTL x 2^n, n capped here (32 x TTL).
MAX_RESEND_DOUBLINGS = 5


def resend_delay(run: Run, ttl: float) -> float:
    """How long the sweeper waits after re-sending ``run`` before it may again:
    one TTL at first, doubling with each re-send that did not move the run."""
    return float(ttl * 2 ** min(run.resends, MAX_RESEND_DOUBLINGS))


def redispatch(run: Run, *, now: float, ttl: float) -> Checkpoint:
    """The sweeper re-sends a run that should be moving but is not.

    An unleased run is marked (owner :data:`SWEEPER`, lease lapsed), so its
    next step takes the careful path, RUNNING checkpoint and counted attempt,
    even if the message comes in time. Re-sends that do not move the run are
    spaced out exponentially (:func:`resend_delay`).
    """
    if run.owner == BACKED_OFF:
        reason = "back-off over"
    elif run.owner == RESCHEDULED:
        reason = "wait over, no message came"
    elif run.owner is not None and run.owner != SWEEPER:
        reason = f"lease of {run.owner} expired {now - (run.lease_expires_at or now):.1f}s ago"
    else:
        reason = f"no step message processed {now - (run.wake_at or now):.1f}s after due"
    delay = resend_delay(run, ttl)
    # A rescheduled run's wait is over: marked as re-sent, so the message is not
    # taken for an early one (its wake-up moves on with this re-send).
    marked = run.owner is None or run.owner == RESCHEDULED
    return Checkpoint(
        run.run_id,
        run.version,
        SWEEPER,
        now,
        run=RunPatch(
            wake_at=now + delay,
            resends=run.resends + 1,
            owner=SWEEPER if marked else KEEP,
            lease_expires_at=LAPSED if marked else KEEP,
        ),
        events=(
            EventDraft(
                "redispatched",
                step_index=run.cursor,
                detail=f"{reason}; re-send {run.resends + 1}, next in {delay:g}s at most",
            ),
        ),
    )


def block(run: Run, reason: str, *, worker: str, now: float) -> Checkpoint:
    """Record, once, why a worker could not carry the run (``show`` has it). The
    run stays movable, so a worker that can (a rolling deploy) still takes it."""
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch(blocked=reason),
        events=(EventDraft("blocked", step_index=run.cursor, detail=reason),),
    )
