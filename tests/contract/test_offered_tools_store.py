"""The store's OfferedTools part on every backend (SQLite, PostgreSQL,
memory): a run's record of the tools it was offered is written once (the
first writer wins, a second gets the first's back), read back as written,
a run's own, gone with the run when it is pruned, carried by its export and
written by its import (a record no provider would take refused)."""

from __future__ import annotations

import copy

import pytest

from harness.engine import transitions
from harness.errors import BadArchive
from harness.records import RunStatus
from harness.runs.archive import content_hash, export_run, import_run
from harness.store import Checkpoint, RunPatch, Store
from harness.store.memory import MemoryStore

NOW = 1_000.0
OFFERED = {"time": [{"name": "get_time", "schema": {"type": "object", "properties": {}}}]}


def test_the_first_record_wins_and_is_read_back(store: Store) -> None:
    assert store.offered_tools("r1") is None
    assert store.offer_tools("r1", OFFERED, NOW) == OFFERED
    later = {"time": []}
    assert store.offer_tools("r1", later, NOW + 1) == OFFERED
    assert store.offered_tools("r1") == OFFERED
    assert store.offered_tools("r2") is None


def test_text_and_nesting_come_back_as_written(store: Store) -> None:
    tools = {"s": [{"description": "Zeit, 時間 \U0001f570", "schema": {"a": [[{"b": None}]]}}]}
    store.offer_tools("r1", tools, NOW)
    assert store.offered_tools("r1") == tools


def test_a_pruned_run_takes_its_record(store: Store) -> None:
    run, steps = transitions.new_run("r1", "agent", "goal", NOW)
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    loaded = store.load("r1")
    store.checkpoint(
        Checkpoint("r1", loaded.version, "t", NOW, run=RunPatch(status=RunStatus.COMPLETED))
    )
    store.offer_tools("r1", OFFERED, NOW)
    store.offer_tools("r2", OFFERED, NOW)
    deleted = store.delete_runs(["r1"], NOW + 10, (RunStatus.COMPLETED,))
    assert [r for r, _ in deleted.runs] == ["r1"]
    assert store.offered_tools("r1") is None
    assert store.offered_tools("r2") == OFFERED


def test_an_export_carries_the_record_and_an_import_writes_it(store: Store) -> None:
    offered = {
        "time": [
            {
                "name": "clock_now",
                "remote": "now",
                "description": "The time.",
                "schema": {"type": "object", "properties": {"tz": {"type": "string"}}},
                "effect": "read_only",
                "requires_approval": False,
            }
        ]
    }
    run, steps = transitions.new_run("r1", "agent", "goal", NOW)
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    store.offer_tools("r1", offered, NOW)
    document = export_run(store, "r1")
    assert document["offered_tools"] == offered
    elsewhere = MemoryStore()
    assert import_run(elsewhere, document).imported
    assert elsewhere.offered_tools("r1") == offered
    assert not import_run(elsewhere, document).imported  # the same content: already there
    plain, steps = transitions.new_run("r2", "agent", "goal", NOW)
    store.create_run(plain, steps, NOW + 30, transitions.created(plain))
    assert "offered_tools" not in export_run(store, "r2")  # as before migration 0017


def test_a_record_no_provider_would_take_is_refused_at_import(store: Store) -> None:
    run, steps = transitions.new_run("r1", "agent", "goal", NOW)
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    tool = {"name": "ok", "remote": "ok", "description": "", "schema": {}, "effect": "read_only"}
    store.offer_tools("r1", {"s": [{**tool, "requires_approval": False}]}, NOW)
    document = export_run(store, "r1")
    for bad in ({"name": "not a name"}, {"effect": "sometimes"}, {"extra": 1}):
        tampered = copy.deepcopy(document)
        tampered["offered_tools"]["s"][0].update(bad)  # type: ignore[index]
        tampered["manifest"]["sha256"] = content_hash(tampered)  # type: ignore[index]
        with pytest.raises(BadArchive):
            import_run(MemoryStore(), tampered)
