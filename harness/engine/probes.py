"""Delivery probes: how the sweeper tells a lost message from a queued one.

A run whose step message is overdue (past ``wake_at``, no lease) has either
lost its message or is still waiting behind a backlog. Re-sending the second
kind only adds duplicates to the very queue that delayed it, so recovery
traffic would grow with load. The broker cannot be asked whether a given
message is still queued, but a queue is first in, first out: once a worker
takes a message off a lane, every message sent down that lane before it
has been delivered too.

So each sweep sends a probe down each lane (a step message for a run id
that names the lane and the time it was sent, which no real run has, under
a task name of its own, ``tasks.probe``, so that Flower can leave probes
out). The worker that takes it off records ``delivered_before``: every
message sent before that time has left the lane. A run whose last write (``updated_at``,
just before its message was sent) is older than that, minus
:data:`MARGIN`, and that has not moved, lost its message: the sweeper
re-sends it. A newer one may still be queued: it waits for the next probe.

Only runs whose message the probes can vouch for wait: an unleased run
(its next step was sent down the normal lane) and one the sweeper re-sent
(the recovery lane). Everything else is re-sent as before: an expired lease
(its message was delivered and its worker died), a run backed off or
waiting for its provider (it may have no message at all), a run on a lane
no probe has come through yet. And none waits longer than
:data:`PATIENCE` TTLs past its wake-up, so a lane whose probes stop coming
through (no worker consumes it, or only workers of an earlier release,
which drop a probe as a message of a task they do not know, or of a run
that does not exist) delays recovery, never stops it.

A probe is sent down a lane when the last one has come through, or has
been on its way for :data:`REPROBE` TTLs (it may have been lost with the
broker's state), so a lane without workers fills with one probe per two
TTLs, not one per sweep. No probe through for :data:`PATIENCE` TTLs is
logged. Lanes are the harness's two, whatever the queue's name: processes
that share a store should share one queue.
"""

from __future__ import annotations

from harness.store import Lane

#: The run id prefix of a probe: ``harness.probe:<lane>:<sent at>``.
PREFIX = "harness.probe:"
NORMAL = "normal"
RECOVERY = "recovery"
LANES = (NORMAL, RECOVERY)
#: Seconds allowed between a run's last write and its message being sent,
#: and for the skew between the clocks of workers and sweeper.
MARGIN = 2.0
#: A probe outstanding this many lease TTLs may be lost (a broker restart, a
#: whole worker killed on the filesystem broker): another is sent.
REPROBE = 2
#: A run is never left waiting for a probe longer than this many lease TTLs
#: past its wake-up time; a lane with no probe through for as long is logged.
PATIENCE = 10


def probe_due(lane: Lane | None, now: float, ttl: float) -> bool:
    """Send a probe down this lane now? Not while one sent less than
    :data:`REPROBE` TTLs ago is on its way."""
    if lane is None or lane.probe_sent_at is None:
        return True
    if lane.delivered_before is not None and lane.delivered_before >= lane.probe_sent_at:
        return True
    return now - lane.probe_sent_at >= REPROBE * ttl


def probe_id(lane: str, sent_at: float) -> str:
    # repr: the time read back from the id is exactly the one recorded as sent.
    return f"{PREFIX}{lane}:{sent_at!r}"


def parse(run_id: str) -> tuple[str, float] | None:
    """``(lane, sent_at)`` of a probe's run id; None if it is not one."""
    if not run_id.startswith(PREFIX):
        return None
    lane, _, sent = run_id[len(PREFIX) :].partition(":")
    try:
        return (lane, float(sent)) if lane in LANES else None
    except ValueError:
        return None


def before(lane: Lane | None, now: float) -> float | None:
    """The last write before which a run's message has left ``lane``, as far
    as the probes can tell (None: no probe delivered there yet). Never later
    than ``now``: a clock that ran ahead must not make every run look lost."""
    if lane is None or lane.delivered_before is None:
        return None
    return min(lane.delivered_before, now) - MARGIN


def stalled(lane: Lane | None, now: float, ttl: float) -> bool:
    """Has no probe come through the lane for :data:`PATIENCE` TTLs, though
    one was sent since?"""
    if lane is None or lane.probe_sent_at is None or lane.delivered_before is None:
        return False  # none ever came through: no run waits for one either
    delivered = lane.delivered_before
    return delivered < lane.probe_sent_at and now - delivered >= PATIENCE * ttl
