"""Sweeps in the store, on every backend: each sweep recorded (the newest
kept, and the newest of each kind), and the lease that lets exactly one
worker sweep while beat does not (harness.celery.takeover)."""

from __future__ import annotations

from harness.store import SCHEDULED_SWEEPS, SWEEPS_KEPT, Sweep, SweepKind
from harness.store.sql import SQLStore


def sweep(kind: SweepKind, at: float, worker: str = "w1@host:1", sent: int = 0) -> Sweep:
    return Sweep(kind, worker, at, at + 0.5, sent)


def test_the_last_sweep_is_the_one_that_started_last(store: SQLStore) -> None:
    assert store.last_sweep() is None
    store.record_sweep(sweep(SweepKind.BEAT, 10.0, "host:7:abc", sent=3))
    store.record_sweep(sweep(SweepKind.WORKER, 30.0))
    store.record_sweep(sweep(SweepKind.COMMAND, 20.0))  # a long one, recorded after
    assert store.last_sweep() == sweep(SweepKind.WORKER, 30.0)
    assert store.last_sweep(SCHEDULED_SWEEPS) == sweep(SweepKind.BEAT, 10.0, "host:7:abc", 3)
    assert store.last_sweep((SweepKind.TASK,)) is None
    assert [s.started_at for s in store.sweeps(2)] == [20.0, 30.0]  # newest recorded first


def test_only_the_newest_sweeps_are_kept_and_the_newest_of_each_kind(store: SQLStore) -> None:
    store.record_sweep(sweep(SweepKind.BEAT, 1.0))
    for i in range(SWEEPS_KEPT + 5):
        store.record_sweep(sweep(SweepKind.WORKER, 100.0 + i))
    kept = store.sweeps(SWEEPS_KEPT + 10)
    assert len(kept) == SWEEPS_KEPT + 1
    assert kept[-1] == sweep(SweepKind.BEAT, 1.0)  # long gone by count, kept as its kind's last
    assert store.last_sweep(SCHEDULED_SWEEPS) == sweep(SweepKind.BEAT, 1.0)


def test_one_holder_at_a_time_until_the_lease_lapses_or_is_given_up(store: SQLStore) -> None:
    assert store.take_sweep_lease("a", now=100.0, until=103.0)
    assert not store.take_sweep_lease("b", now=101.0, until=104.0)
    assert store.take_sweep_lease("a", now=102.0, until=105.0)  # renewed
    assert not store.take_sweep_lease("b", now=104.9, until=108.0)
    assert store.take_sweep_lease("b", now=105.1, until=108.0)  # a's lapsed
    store.release_sweep_lease("a")  # not a's any more: nothing changes
    assert not store.take_sweep_lease("a", now=106.0, until=109.0)
    store.release_sweep_lease("b")
    assert store.take_sweep_lease("a", now=106.0, until=109.0)


def test_a_reset_forgets_sweeps_and_the_lease(store: SQLStore) -> None:
    store.record_sweep(sweep(SweepKind.BEAT, 1.0))
    assert store.take_sweep_lease("a", now=1.0, until=1e12)
    store.reset()
    assert store.last_sweep() is None
    assert store.take_sweep_lease("b", now=2.0, until=5.0)
