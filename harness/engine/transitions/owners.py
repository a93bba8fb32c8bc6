"""Who owns a run: the marks written in its ``owner`` column instead of a
worker's name, and the takeover event a worker's lapsed name there calls for.

Who owns a run is the ``owner`` column: a worker id (its lease, live or
lapsed), ``None`` (unleased, a step message in flight), or a mark with a
lease already lapsed that sends the next step down the careful path:
:data:`SWEEPER` (re-sent by the sweeper), :data:`BACKED_OFF` (a claim gave
way to a busy idempotency key; a step left RUNNING by that claim is not a
new interruption) or :data:`RESCHEDULED` (the step waits for a provider
until ``wake_at``; a message that comes earlier is dropped).
"""

from __future__ import annotations

from harness.records import Run
from harness.store import EventDraft

#: The owner the sweeper writes, lease already lapsed, on a run it re-sends.
SWEEPER = "sweeper"
#: The owner a claim leaves when it gives way to a busy idempotency key.
BACKED_OFF = "backed-off"
#: The worker name of operator actions in the flight recorder.
OPERATOR = "operator"
#: The owner of a run whose step waits for a provider (a retry, a rate limit).
RESCHEDULED = "rescheduled"
#: Owners that are marks, not workers: taking such a run over is no takeover.
MARKS = frozenset({SWEEPER, BACKED_OFF, RESCHEDULED})
#: The lease expiry a mark writes: lapsed on every clock, however skewed.
LAPSED = 0.0


def takeover(run: Run) -> tuple[EventDraft, ...]:
    """The event of a write that takes ``run`` from a worker whose lease
    lapsed; none if it had no owner, or a mark."""
    # Leases are released after each step, so a worker's name still there means it lapsed.
    if run.owner is None or run.owner in MARKS:
        return ()
    return (EventDraft("lease_takeover", detail=f"from {run.owner}"),)
