"""The sweeper: recovery that does not depend on the broker.

Every ``HARNESS_SWEEP_INTERVAL`` seconds (Celery beat; a worker while no
beat sweeps, harness.celery.takeover; or ``harness sweep``) it finds runs
that should be moving but are not, and sends each a fresh step message:

* leased, but the lease expired: the owner died or hung mid-step;
* unleased, and no message processed it by ``wake_at``: the message was lost
  (a whole worker killed on the filesystem broker, a purged queue, a crash
  between the result checkpoint and the dispatch);
* waiting on deferred calls whose time has come (a timeout, a sleep's end,
  an answer whose sender died before waking the run, a look at a child):
  answered as due and woken (harness.engine.waits).

Each re-dispatch is a CAS that pushes ``wake_at`` forward (one TTL, then
doubling while the run does not move: see ``transitions.redispatch``), so a
run whose message is merely slow is not re-sent at every sweep, and one that
no worker can carry is not re-sent forever at full rate. The duplicate is
dropped by the runner's cursor and lease checks. Re-sends go out on the
recovery lane of the sender, which may put them ahead of a backlog.

A message that is merely waiting behind a backlog is not lost: delivery
probes (harness.engine.probes) tell the two apart, so the sweeper does not
add duplicates to the queue that delayed them.

Each sweep is recorded in the store (who, when, how many re-sent): that is
how health, stats and metrics know the last sweep's age, how a run whose
lease lapsed with no sweep since gets an operator's attention, and how
workers notice that beat has stopped sweeping.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from harness.engine import conversation, probes, transitions, waits
from harness.engine.runtime import Runtime, commit, dispatch
from harness.errors import StaleWriteError, StoreError
from harness.store import Delivered, Lane, Sweep, SweepKind

log = logging.getLogger(__name__)

#: Sweep intervals with no sweep by beat after which a worker takes the sweep
#: over (harness.celery.takeover); a sweep older than one interval more than
#: that means no one sweeps (``harness health --sweeps``).
STALE = 3


@dataclass(frozen=True)
class Redispatched:
    run_id: str
    cursor: int
    reason: str


def sweep(
    rt: Runtime, limit: int = 500, probe: bool = True, kind: SweepKind = SweepKind.COMMAND
) -> list[Redispatched]:
    """Re-dispatch every stuck run; return what was sent. With ``rt.probes``,
    a run whose message may still be queued is left alone (for at most
    ``probes.PATIENCE`` TTLs), and with ``probe`` each lane that has no probe
    on its way gets one, for the next sweep (harness.engine.probes).

    A sweep that went through is recorded, as ``kind``, run by
    ``rt.worker_id``: health, stats and metrics report the last one's age,
    and workers take the sweep over when beat's stop (harness.celery.takeover)."""
    now = rt.clock.now()
    sent = _redispatch(rt, now, limit, probe)
    if rt.streams is not None:
        try:
            rt.streams.trim(now)  # answers' streams past HARNESS_STREAM_TTL (harness.streams)
        except StoreError as err:
            log.warning("streams not trimmed: %s", err)
    try:
        rt.store.record_sweep(Sweep(kind, rt.worker_id, now, rt.clock.now(), len(sent)))
    except StoreError as err:  # the runs were re-sent all the same
        log.warning("sweep not recorded: %s", err)
    return sent


def _redispatch(rt: Runtime, now: float, limit: int, probe: bool) -> list[Redispatched]:
    """Re-send the stuck runs, and probe the lanes (:func:`sweep`)."""
    sent: list[Redispatched] = []
    lanes = rt.store.lanes() if rt.probes else {}
    delivered = Delivered(
        transitions.SWEEPER,
        oldest=now - probes.PATIENCE * rt.lease_ttl,
        normal=probes.before(lanes.get(probes.NORMAL), now),
        recovery=probes.before(lanes.get(probes.RECOVERY), now),
    )
    for run in rt.store.due_runs(now, limit, delivered if rt.probes else None):
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
    for run_id, cursor in waits.sweep(rt, now, limit):  # timeouts, sleeps, lost wake-ups
        sent.append(Redispatched(run_id, cursor, "its wait is over"))
    # A message kept as its run completed, whose sender and finisher both died.
    for run_id in rt.store.stranded_inboxes(now - rt.lease_ttl, limit):
        if conversation.continue_completed(rt, run_id):
            sent.append(Redispatched(run_id, rt.store.load(run_id).cursor, "a message waited"))
    if rt.probes and probe:
        _probe(rt, lanes, now)
    return sent


def _probe(rt: Runtime, lanes: dict[str, Lane], now: float) -> None:
    """Send a probe down each lane that has none on its way."""
    for name in probes.LANES:
        lane = lanes.get(name)
        if not probes.probe_due(lane, now, rt.lease_ttl):
            continue
        if probes.stalled(lane, now, rt.lease_ttl):
            assert lane is not None
            log.warning(
                "no probe came through the %s lane in %d lease TTLs: is a worker of this "
                "release consuming it? Overdue runs are re-sent %d TTLs past their wake-up",
                name,
                probes.PATIENCE,
                probes.PATIENCE,
            )
        if dispatch(rt, probes.probe_id(name, now), 0, recovery=name == probes.RECOVERY):
            try:
                rt.store.note_probe_sent(name, now)
            except StoreError as err:  # then the next sweep sends another: harmless
                log.warning("probe of lane %s not noted as sent: %s", name, err)
