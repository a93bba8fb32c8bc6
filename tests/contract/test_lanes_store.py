"""Delivery probes in the store (harness.engine.probes), on every backend:
the lanes' record, and which overdue runs the sweeper is given."""

from __future__ import annotations

import time
from dataclasses import replace

from harness.engine import transitions
from harness.records import Run
from harness.store import Delivered, Lane, RunPatch
from harness.store.sql import SQLStore
from tests.rig import insert_run


def _mark(store: SQLStore, run: Run, owner: str | None, at: float) -> None:
    """Leave ``run`` unleased (or under a mark) last written at ``at``, overdue."""
    cp = transitions.renew(run.run_id, run.version, worker="w", now=at, ttl=0)
    patch = RunPatch(owner=owner, lease_expires_at=0.0 if owner else None, wake_at=at)
    store.checkpoint(replace(cp, run=patch))


def test_a_lane_records_its_last_probe_and_the_newest_delivered(store: SQLStore) -> None:
    assert store.lanes() == {}
    store.note_probe_sent("normal", 10.0)
    store.note_delivered("normal", 10.0)
    store.note_delivered("normal", 5.0)  # an older probe taken off late: no step back
    store.note_delivered("recovery", 7.0)
    store.note_probe_sent("normal", 12.0)
    assert store.lanes() == {"normal": Lane(12.0, 10.0), "recovery": Lane(None, 7.0)}


def test_overdue_runs_written_after_the_lanes_mark_are_left_out(store: SQLStore) -> None:
    now = time.time()
    cases = {
        "old-normal": (None, now - 100),  # sent before the normal mark: lost
        "new-normal": (None, now - 10),  # after it: may be queued
        "new-backed-off": ("backed-off", now - 10),  # no message to wait for
        "old-resent": ("sweeper", now - 100),  # re-sent before the recovery mark: lost
        "new-resent": ("sweeper", now - 10),
    }
    for run_id, (owner, at) in cases.items():
        _mark(store, insert_run(store, run_id), owner, at)
    lapsed = insert_run(store, "lapsed-lease")  # a worker's, expired: its worker died
    cp = transitions.renew("lapsed-lease", lapsed.version, worker="w/1", now=now - 10, ttl=1)
    store.checkpoint(replace(cp, run=replace(cp.run, wake_at=now - 10)))

    def due(normal: float | None, recovery: float | None, oldest: float = now - 1000) -> set[str]:
        delivered = Delivered(transitions.SWEEPER, oldest, normal, recovery)
        return {r.run_id for r in store.due_runs(now, 100, delivered)}

    every = set(cases) | {"lapsed-lease"}
    always = {"new-backed-off", "lapsed-lease"}  # no message the probes could vouch for
    assert {r.run_id for r in store.due_runs(now, 100)} == every
    assert due(None, None) == every
    assert due(now - 50, now - 50) == always | {"old-normal", "old-resent"}
    assert due(now - 50, None) == always | {"old-normal", "old-resent", "new-resent"}
    assert due(None, now - 50) == always | {"old-normal", "new-normal", "old-resent"}
    assert due(now, now) == every
    # Overdue for longer than the sweeper waits for a probe: due whatever the lanes say.
    assert due(now - 50, now - 50, oldest=now - 5) == every
