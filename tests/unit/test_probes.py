"""Delivery probes (harness.engine.probes): the sweeper re-sends a run whose
message was lost, and leaves alone one whose message waits behind a backlog.

The rig's queue is first in, first out, as the brokers' are: a probe that
comes off it vouches for every message sent before it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import harness
from harness.engine import probes, recovery, transitions
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus
from harness.store import Lane
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.rig import Rig

CALLED: list[str] = []


@harness.tool(effect="idempotent")
def tick(ctx: harness.ToolContext) -> str:
    CALLED.append(ctx.idempotency_key)
    return "ok"


AGENT = "u-probed"
harness.register_agent(
    harness.Agent(
        name=AGENT,
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "tick", "args": {}}]}, {"final": "done"}]
        ),
        tools=[tick],
    )
)


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLED.clear()
    yield Rig(memory_store, options={"probes": True})


def queued_probes(rig: Rig) -> list[tuple[str, float]]:
    return [p for p in (probes.parse(run_id) for run_id, _ in rig.sent) if p is not None]


def sweep(rig: Rig) -> list[str]:
    return [r.run_id for r in recovery.sweep(rig.runtime("sweeper"))]


def test_a_run_queued_behind_a_backlog_is_left_alone_and_a_lost_one_is_resent(
    rig: Rig,
) -> None:
    t0 = rig.clock.now()
    assert sweep(rig) == []
    assert sorted(queued_probes(rig)) == [("normal", t0), ("recovery", t0)]
    assert rig.drive() == [TaskResult.PROBE, TaskResult.PROBE]
    assert rig.store.lanes() == {
        "normal": Lane(t0, t0),
        "recovery": Lane(t0, t0),
    }

    rig.clock.advance(10)
    runs = [create_run(rig.runtime(), AGENT, f"g{i}") for i in range(10)]
    lost = runs[3]
    rig.sent.remove((lost, 0))
    rig.clock.advance(3 * rig.lease_ttl)  # every run is overdue: its message waits
    t2 = rig.clock.now()
    assert sweep(rig) == []  # queued after the last probe delivered: maybe still waiting
    assert queued_probes(rig) == [("normal", t2), ("recovery", t2)]  # behind the backlog

    rig.drive()  # the backlog, then the probes behind it
    assert rig.store.lanes()["normal"].delivered_before == t2
    assert [rig.load(r).status for r in runs].count(RunStatus.COMPLETED) == 9
    rig.clock.advance(3 * rig.lease_ttl)
    assert sweep(rig) == [lost]  # sent before a probe that came through: lost
    rig.drive()
    assert rig.load(lost).status is RunStatus.COMPLETED
    assert sorted(CALLED) == sorted(f"{r}:1" for r in runs)  # each call once


def test_an_expired_lease_is_resent_whatever_the_probes_say(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), AGENT, "g")
    rig.sent.clear()
    rig.store.note_delivered("normal", rig.clock.now() - 100)  # long before the run
    run = rig.load(run_id)
    assert run.current is not None
    claim = transitions.claim(run, run.current, worker="w-dead/1", now=rig.clock.now(), ttl=30)
    rig.store.checkpoint(claim)
    rig.clock.advance(31)
    assert sweep(rig) == [run_id]


def test_a_lane_with_no_probe_delivered_yet_is_swept_as_before(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), AGENT, "g")
    rig.sent.clear()  # lost, and no probe ever came through
    rig.clock.advance(rig.lease_ttl + 1)
    assert sweep(rig) == [run_id]


def test_a_resent_run_is_judged_by_the_recovery_lane(rig: Rig) -> None:
    rig.store.note_delivered("recovery", rig.clock.now() - 100)
    run_id = create_run(rig.runtime(), AGENT, "g")
    rig.sent.clear()
    rig.clock.advance(rig.lease_ttl + 1)
    rig.store.note_delivered("normal", rig.clock.now())  # its message left the lane: lost
    assert sweep(rig) == [run_id]
    rig.sent.clear()  # the re-send is lost too
    rig.store.note_delivered("normal", rig.clock.now() + 1000)
    rig.clock.advance(3 * rig.lease_ttl)  # past its next wake-up, within PATIENCE
    assert sweep(rig) == []  # sent down the recovery lane, where no newer probe came through
    rig.store.note_delivered("recovery", rig.clock.now())
    assert sweep(rig) == [run_id]


def test_a_run_waits_for_a_probe_no_longer_than_patience_allows(rig: Rig) -> None:
    rig.store.note_delivered("normal", rig.clock.now() - 100)  # and none comes through again
    run_id = create_run(rig.runtime(), AGENT, "g")
    rig.sent.clear()
    rig.clock.advance(rig.lease_ttl + 1)
    assert sweep(rig) == []
    rig.clock.advance(probes.PATIENCE * rig.lease_ttl)
    assert sweep(rig) == [run_id]


def test_a_backed_off_run_is_not_held_back_it_has_no_message(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), AGENT, "g")
    rig.sent.clear()
    run = rig.load(run_id)
    assert run.current is not None
    now = rig.clock.now()
    claim = transitions.claim(run, run.current, worker="w/1", now=now, ttl=30)
    version = rig.store.checkpoint(claim)
    back = transitions.back_off(
        rig.load(run_id), run.current, version=version, worker="w", now=now,
        retry_after=1.0, reason="busy", claimed=True,
    )  # fmt: skip
    rig.store.checkpoint(back)
    rig.store.note_delivered("normal", now - 100)  # nothing since: a backlog, as it looks
    rig.clock.advance(2)
    assert sweep(rig) == [run_id]


def test_a_probe_id_carries_its_time_exactly(sqlite_store: SQLStore) -> None:
    from tests.rig import FakeClock

    rig = Rig(sqlite_store, clock=FakeClock(1_000_000.0000004), options={"probes": True})
    sweep(rig)
    rig.drive()  # the probes come through: none is left looking outstanding
    lanes = rig.store.lanes()
    assert all(lane.delivered_before == lane.probe_sent_at for lane in lanes.values())
    sweep(rig)
    assert len(queued_probes(rig)) == 2  # so the next sweep sends the next two


def test_a_mark_ahead_of_the_clock_holds_nothing_back_beyond_now(rig: Rig) -> None:
    lane = Lane(delivered_before=rig.clock.now() + 3600)
    assert probes.before(lane, rig.clock.now()) == rig.clock.now() - probes.MARGIN


def test_one_probe_at_a_time_per_lane_until_it_may_be_lost(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    sweep(rig)
    rig.drive()  # the first probes come through
    rig.clock.advance(1)
    sweep(rig)
    rig.sent.clear()  # the next ones are lost (a broker restart)
    rig.clock.advance(1)
    sweep(rig)
    assert queued_probes(rig) == []  # they may still be on their way
    rig.clock.advance(probes.REPROBE * rig.lease_ttl)
    sweep(rig)
    assert len(queued_probes(rig)) == 2  # on their way too long: sent again
    assert "no probe came through" not in caplog.text
    rig.sent.clear()
    rig.clock.advance(probes.PATIENCE * rig.lease_ttl)
    sweep(rig)
    assert "no probe came through the normal lane in 10 lease TTLs" in caplog.text


def test_a_delivered_probe_never_moves_the_mark_back(rig: Rig) -> None:
    rig.store.note_delivered("normal", 50.0)
    rig.store.note_delivered("normal", 40.0)  # an older probe, taken off late
    assert rig.store.lanes()["normal"].delivered_before == 50.0
    assert run_step(rig.runtime(), probes.probe_id("normal", 60.0)) is TaskResult.PROBE
    assert rig.store.lanes()["normal"].delivered_before == 60.0


@pytest.mark.parametrize("run_id", ["harness.probe:other:1", "harness.probe:normal:x", "run-1"])
def test_only_a_well_formed_probe_id_is_a_probe(run_id: str) -> None:
    assert probes.parse(run_id) is None


def test_without_probes_the_sweeper_sends_none(sqlite_store: SQLStore) -> None:
    rig = Rig(sqlite_store)
    recovery.sweep(rig.runtime())
    assert rig.sent == [] and sqlite_store.lanes() == {}


def test_probes_are_on_unless_switched_off_and_a_bad_word_is_refused() -> None:
    from harness.errors import ConfigError
    from harness.settings import Settings

    assert Settings.from_env({}).delivery_probes is True
    assert Settings.from_env({"HARNESS_DELIVERY_PROBES": "off"}).delivery_probes is False
    with pytest.raises(ConfigError, match="HARNESS_DELIVERY_PROBES='maybe': give on or off"):
        Settings.from_env({"HARNESS_DELIVERY_PROBES": "maybe"})
