"""The sweep finds a run the moment its wake-up has passed, wherever in a
minute that falls, on every backend: the SQL stores look for it by the
minute of ``wake_at`` (``wake_minute``, migration 0019), rounded by the
database on both sides of the comparison, so a run is never left behind
for a minute by a rounding at the boundary."""

from __future__ import annotations

import importlib.util
import re

import pytest

import harness
from harness.engine.creation import create_run
from harness.records import RunStatus
from harness.runs import archive
from harness.runs.prune import prune
from harness.store import Store
from harness.store.migrate import MIGRATIONS, downgrade, upgrade
from harness.store.schema.tables import WAKE_MINUTE
from harness.store.sql import SQLStore, make_engine
from tests.rig import Rig

MINUTE = 60.0 * 16_667  # a whole minute, near the rig clock's start
#: Where in its minute a wake-up falls: on the minute, just before and after
#: the half (where round() turns), and just before the next minute.
OFFSETS = (0.0, 29.999, 30.0, 30.001, 59.999)


@harness.tool(effect="idempotent")
def sm_wait() -> harness.Deferred:
    return harness.Deferred(timeout=5.0)


harness.register_agent(
    harness.Agent(
        name="sm-waiter",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "sm_wait", "args": {}}]}, {"final": "done"}]
        ),
        tools=[sm_wait],
    )
)
harness.register_agent(
    harness.Agent(name="sm-mover", model=harness.ScriptedModel([{"final": "done"}]), tools=[])
)


@pytest.mark.parametrize("offset", OFFSETS)
def test_a_waiting_run_is_due_just_past_its_wake_up(store: Store, offset: float) -> None:
    rig = Rig(store)
    rig.clock.t = MINUTE + offset - 5.0  # its wait ends at MINUTE + offset
    run_id = create_run(rig.runtime(), "sm-waiter", "wait")
    rig.drive()
    run = store.load(run_id)
    assert run.status is RunStatus.WAITING and run.wake_at is not None
    assert run.wake_at == pytest.approx(MINUTE + offset)
    assert [r.run_id for r in store.due_waits(run.wake_at)] == []
    assert [r.run_id for r in store.due_waits(run.wake_at + 0.0005)] == [run_id]
    assert [r.run_id for r in store.due_waits(run.wake_at + 60)] == [run_id]


@pytest.mark.parametrize("offset", OFFSETS)
def test_a_run_whose_message_was_lost_is_due_just_past_its_wake_up(
    store: Store, offset: float
) -> None:
    rig = Rig(store)
    rig.clock.t = MINUTE + offset - rig.lease_ttl  # its message is due at MINUTE + offset
    run_id = create_run(rig.runtime(), "sm-mover", "move")
    rig.sent.clear()  # the message is lost
    run = store.load(run_id)
    assert run.wake_at == pytest.approx(MINUTE + offset)
    assert [r.run_id for r in store.due_runs(run.wake_at)] == []
    assert [r.run_id for r in store.due_runs(run.wake_at + 0.0005)] == [run_id]


def test_migration_0019_gives_the_runs_there_their_minute(database_url: str) -> None:
    """Down to 0018 and up again, on a store holding a waiting run, a run
    whose message was lost and an ended one: the database computes the
    minute of those already there, and the sweep's queries find them as
    before; an export carries no computed column, and imports again."""
    store = SQLStore.from_url(database_url)
    rig = Rig(store)
    waiting = create_run(rig.runtime(), "sm-waiter", "wait")
    rig.drive()
    lost = create_run(rig.runtime(), "sm-mover", "move")
    rig.sent.clear()
    ended = create_run(rig.runtime(), "sm-mover", "end")
    rig.drive()
    assert store.load(ended).status is RunStatus.COMPLETED
    later = rig.clock.now() + rig.lease_ttl + 1
    store.close()
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0018")
    finally:
        upgrade(engine)
        engine.dispose()
    store = SQLStore.from_url(database_url)
    try:
        assert [r.run_id for r in store.due_waits(later)] == [waiting]
        assert [r.run_id for r in store.due_runs(later)] == [lost]
        exported = archive.export_run(store, waiting)
        assert "wake_minute" not in exported["run"]  # type: ignore[operator]
        assert not archive.import_run(store, exported, now=later).imported  # the same content
        document = archive.export_run(store, ended)
        prune(store, older_than=1, now=later + 10)
        assert archive.import_run(store, document, now=later).imported
        assert store.load(ended).status is RunStatus.COMPLETED
    finally:
        store.close()


def test_the_minute_is_kept_for_the_statuses_the_sweep_reads() -> None:
    """The column's text names the statuses the sweep's queries ask for (the
    movable ones and waiting), and is the text migration 0019 created."""
    spec = importlib.util.spec_from_file_location(
        "m0019", MIGRATIONS / "versions" / "0019_wake_minute.py"
    )
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert migration.WAKE_MINUTE == WAKE_MINUTE
    swept = {s.value for s in RunStatus if s.movable or s is RunStatus.WAITING}
    named = set(re.findall(r"'(\w+)'", WAKE_MINUTE))
    assert named == swept
