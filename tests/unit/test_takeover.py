"""Workers take the sweep over while beat does not sweep (harness.celery.takeover),
one tick at a time on a hand-moved clock."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.celery.takeover import STALE, Takeover, bootstep
from harness.engine import recovery, transitions
from harness.engine.creation import create_run
from harness.engine.runtime import Sender
from harness.settings import Settings
from harness.store import SweepKind
from harness.store.memory import MemoryStore
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore
from tests.rig import Rig
from tests.unit.test_probes import AGENT
from tests.web import wait_for

INTERVAL = 5.0
STALE_AFTER = STALE * INTERVAL


@pytest.fixture
def rig(memory_store: MemoryStore) -> Rig:
    return Rig(memory_store)


def watch(rig: Rig, name: str) -> Takeover:
    return Takeover(rig.runtime(name), INTERVAL)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "harness.celery.takeover" and r.levelno == logging.WARNING
    ]


def test_a_worker_up_long_enough_with_no_beat_sweeps_and_says_so_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    w1 = watch(rig, "w1@host:1")
    rig.clock.advance(STALE_AFTER - 1)
    assert not w1.tick()  # beat may be starting beside it
    assert rig.store.last_sweep() is None
    rig.clock.advance(1)
    assert w1.tick()
    swept = rig.store.last_sweep()
    assert swept is not None
    assert (swept.kind, swept.worker, swept.started_at) == (
        SweepKind.WORKER,
        "w1@host:1",
        rig.clock.now(),
    )
    rig.clock.advance(INTERVAL)
    assert w1.tick()
    assert warnings(caplog) == [
        "no sweep recorded (is `celery beat` running?): this worker sweeps until one is"
    ]


def test_it_says_how_long_beat_has_been_quiet(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    recovery.sweep(rig.runtime("beat"), kind=SweepKind.BEAT)
    w1 = watch(rig, "w1")
    rig.clock.advance(45)
    assert w1.tick()
    assert warnings(caplog) == [
        "no sweep for 45s (is `celery beat` running?): this worker sweeps until one is"
    ]


def test_exactly_one_of_two_workers_sweeps_until_it_stops(rig: Rig) -> None:
    w1, w2 = watch(rig, "w1"), watch(rig, "w2")
    rig.clock.advance(STALE_AFTER)
    assert w1.tick()
    for _ in range(4):
        assert not w2.tick()
        rig.clock.advance(INTERVAL)
        assert w1.tick()
    # w1 dies: its lease lapses STALE intervals after its last sweep, and w2 takes over.
    died = rig.clock.now()
    while rig.clock.now() - died <= STALE_AFTER:
        assert not w2.tick()
        rig.clock.advance(1)
    assert w2.tick()
    assert [s.worker for s in rig.store.sweeps()] == ["w2"] + ["w1"] * 5


def test_beat_sweeping_again_stands_the_worker_down(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    w1 = watch(rig, "w1")
    rig.clock.advance(STALE_AFTER)
    assert w1.tick()
    rig.clock.advance(2)
    recovery.sweep(rig.runtime("beat"), kind=SweepKind.BEAT)
    rig.clock.advance(1)
    assert not w1.tick()
    assert warnings(caplog)[-1] == "beat swept 1.0s ago: this worker stops sweeping"
    assert rig.store.take_sweep_lease("w2", rig.clock.now(), rig.clock.now() + 1)  # given up
    rig.clock.advance(STALE_AFTER)  # and beat stops again (w2's lease has lapsed)
    assert w1.tick()
    assert warnings(caplog)[-1].startswith("no sweep for 16s")


def test_a_sweep_by_hand_is_no_schedule(rig: Rig) -> None:
    w1 = watch(rig, "w1")
    rig.clock.advance(STALE_AFTER)
    assert w1.tick()
    recovery.sweep(rig.runtime("cli"))  # harness sweep, once
    rig.clock.advance(INTERVAL)
    assert w1.tick()


def test_the_workers_sweep_recovers_a_run_whose_worker_died(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), AGENT, "g")
    rig.sent.clear()
    run = rig.load(run_id)
    assert run.current is not None
    claim = transitions.claim(run, run.current, worker="dead/1", now=rig.clock.now(), ttl=10)
    rig.store.checkpoint(claim)
    w1 = watch(rig, "w1")
    rig.clock.advance(STALE_AFTER)
    assert w1.tick()
    assert rig.resent == [(run_id, 0)]
    swept = rig.store.last_sweep()
    assert swept is not None and swept.redispatched == 1


def test_a_store_that_does_not_answer_is_logged_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    store = SQLStore.from_url(f"sqlite:///{tmp_path / 'later.db'}")  # no tables yet
    rig = Rig(store)
    w1 = watch(rig, "w1")
    rig.clock.advance(STALE_AFTER)
    w1.safe_tick()
    assert "sweep watch:" in warnings(caplog)[-1]
    upgrade(store.engine)  # the store is back
    w1.safe_tick()
    assert rig.store.last_sweep() is not None
    store.close()


def test_the_worker_bootstep_sweeps_from_a_thread_and_gives_the_lease_up_at_stop(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str, sqlite_store: SQLStore
) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_SWEEP_INTERVAL", "0.05")
    sent: list[str] = []

    def sender(settings: Settings) -> Sender:
        return lambda run_id, cursor, **_: sent.append(run_id)

    step = bootstep(sender, Settings.from_env)(parent := SimpleNamespace(hostname="w9@host"))
    step.start(parent)
    try:
        wait_for("a sweep from the worker's thread", sqlite_store.last_sweep, timeout=30)
    finally:
        step.stop(parent)
    swept = sqlite_store.last_sweep()
    assert swept is not None and swept.kind is SweepKind.WORKER
    assert swept.worker == f"w9@host:{os.getpid()}"
    assert sqlite_store.take_sweep_lease("w10", time.time(), time.time() + 1)  # given up
