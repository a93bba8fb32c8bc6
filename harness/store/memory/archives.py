"""Runs whole in memory: export, import and fork (Archives), and prune
(Retention), with the guards of :mod:`harness.store.schema`'s statements
(the prune's fork-ancestry walk and its delete guard) written in Python.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from harness.errors import RunNotFound, StoreError
from harness.inputs import storable
from harness.records import Run, RunStatus, Step
from harness.store import mapping, schema
from harness.store.checkpoint import EventDraft, ToolRecord
from harness.store.memory import rows
from harness.store.memory.rows import EVENTS, RUNS, SIGNALS, STEPS, TOOL_RESULTS, Row
from harness.store.memory.runs import MemoryRuns, _check_new_steps
from harness.store.memory.tables import Tables
from harness.store.values import Deleted, RowCounts, RunRows


class MemoryArchives(MemoryRuns):
    """Export, import, fork and prune."""

    # -- export and import (Archives) ----------------------------------------------

    def run_rows(self, run_id: str) -> RunRows:
        with self._lock:
            t = self._tables
            run = mapping.decoded(schema.runs.name, t.run(run_id))
            steps = [s for _, s in sorted(t.steps.get(run_id, {}).items())]
            events = [{c: v for c, v in e.items() if c != "id"} for e in t.events.get(run_id, [])]
            records = sorted(
                (r for r in t.tool_results.values() if r["run_id"] == run_id),
                key=lambda r: (r["step_index"], r["key"]),
            )
            kept = [
                {c: v for c, v in s.items() if c != "id"}
                for _, s in sorted(t.signals.items())
                if s["run_id"] == run_id
            ]
            offered = t.run_tools.get(run_id)
        return RunRows(
            run,
            tuple(mapping.decoded(schema.steps.name, s) for s in steps),
            tuple(events),
            tuple(mapping.decoded(schema.tool_results.name, r) for r in records),
            tuple(mapping.decoded(schema.signals.name, s) for s in kept),
            None if offered is None else json.loads(offered),
        )

    def import_run(self, rows_: RunRows) -> bool:
        run_id = rows_.run["run_id"]
        try:
            run = RUNS.row(storable(mapping.imported_run(rows_.run)))
            steps = [STEPS.row(rows.encoded(schema.steps.name, s)) for s in rows_.steps]
            events = [EVENTS.row(rows.encoded(schema.events.name, e)) for e in rows_.events]
            records = [
                TOOL_RESULTS.row(rows.encoded(schema.tool_results.name, r))
                for r in rows_.tool_records
            ]
            kept = [SIGNALS.row(rows.encoded(schema.signals.name, s)) for s in rows_.signals]
        except StoreError as err:  # a NOT NULL column left empty
            raise StoreError(f"run {run_id} not imported: {err}") from err
        with self._lock:
            t = self._tables
            if run_id in t.runs:
                return False
            try:
                _check_new_steps(t, run_id, steps)
                _check_new_records(t, records)
            except StoreError as err:
                raise StoreError(f"run {run_id} not imported: {err}") from err
            self._insert_run(run, steps, events)
            t.tool_results.update((r["key"], r) for r in records)
            for signal in kept:  # new ids, as SQL's autoincrement gives them
                t.last_signal_id += 1
                t.signals[t.last_signal_id] = {"id": t.last_signal_id, **signal}
            if rows_.offered_tools is not None:
                t.run_tools[run_id] = json.dumps(rows_.offered_tools)
            return True

    def create_fork(
        self,
        run: Run,
        steps: Sequence[Step],
        records: Sequence[ToolRecord],
        wake_at: float,
        created: EventDraft,
    ) -> tuple[Run, bool]:
        row = rows.run_row(run, wake_at)
        event = rows.event_row(run.run_id, run.version, None, run.created_at, created)
        step_rows = [rows.step_row(s) for s in steps]
        record_rows = [rows.record_row(run.run_id, r, run.created_at) for r in records]
        with self._lock:
            t = self._tables
            origin = run.forked_from
            if origin is not None and origin.run_id not in t.runs:
                raise RunNotFound(
                    origin.run_id,
                    f"run {origin.run_id!r} was deleted (pruned) while the fork was "
                    "made: no fork created",
                )
            if run.run_id in t.runs:
                return self.load(run.run_id), False
            try:
                _check_new_steps(t, run.run_id, step_rows)
                _check_new_records(t, record_rows)
            except StoreError as err:
                raise StoreError(f"fork {run.run_id} not created: {err}") from err
            self._insert_run(row, step_rows, [event])
            t.tool_results.update((r["key"], r) for r in record_rows)
            return self.load(run.run_id), True

    # -- prune (Retention) ---------------------------------------------------------

    def prune_candidates(
        self,
        cutoff: float,
        statuses: tuple[RunStatus, ...],
        limit: int,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        values = _values(statuses)
        with self._lock:
            found = [
                r
                for r in self._tables.runs.values()
                if r["created_at"] <= cutoff
                and _prunable(r, cutoff, values)
                and (after is None or (r["created_at"], r["run_id"]) > after)
            ]
        found.sort(key=lambda r: (r["created_at"], r["run_id"]))
        return [rows.to_run(r) for r in found[:limit]]

    def fork_protected(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> set[str]:
        values = _values(statuses)
        with self._lock:
            children = _children(self._tables)
            return {
                root
                for root in run_ids
                if any(
                    not _prunable(self._tables.runs[d], cutoff, values)
                    for d in _descendants(children, root)
                )
            }

    def count_run_rows(self, run_ids: Sequence[str]) -> RowCounts:
        ids = list(run_ids)
        with self._lock:
            t = self._tables
            steps = sum(len(t.steps.get(r, {})) for r in ids)
            events = sum(len(t.events.get(r, [])) for r in ids)
            return RowCounts(steps, events, len(t.records_of(ids)))

    def delete_runs(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> Deleted:
        values = _values(statuses)
        with self._lock:
            t = self._tables
            children = _children(t)
            gone = _deletable(t, children, list(dict.fromkeys(run_ids)), cutoff, values)
            # As SQLStore: the forks of runs deleted go too, a generation at a
            # time, or the whole batch is rolled back (nothing deleted yet here).
            frontier = gone
            while frontier:
                below = [c for r in frontier for c in children.get(r, []) if c not in gone]
                if not below:
                    break
                frontier = _deletable(t, children, below, cutoff, values)
                kept = sorted(set(below) - set(frontier))
                if kept:
                    return Deleted((), RowCounts(), kept_children=tuple(kept))
                gone = gone + frontier
            return _delete(t, gone)


def _values(statuses: tuple[RunStatus, ...]) -> tuple[str, ...]:
    return tuple(s.value for s in statuses)


def _prunable(row: Row, cutoff: float, statuses: tuple[str, ...]) -> bool:
    """schema.archives._prunable: a run of a status being pruned, untouched since ``cutoff``."""
    return row["status"] in statuses and row["updated_at"] <= cutoff


def _children(t: Tables) -> dict[str, list[str]]:
    """Each run's direct forks (the index on forked_from_run)."""
    children: dict[str, list[str]] = {}
    for row in t.runs.values():
        if row["forked_from_run"] is not None:
            children.setdefault(row["forked_from_run"], []).append(row["run_id"])
    return children


def _descendants(children: dict[str, list[str]], root: str) -> set[str]:
    """Forks of ``root``, of its forks and so on (ends on a cycle, as UNION does)."""
    found: set[str] = set()
    todo = list(children.get(root, []))
    while todo:
        run_id = todo.pop()
        if run_id not in found:
            found.add(run_id)
            todo.extend(children.get(run_id, []))
    return found


def _deletable(
    t: Tables,
    children: dict[str, list[str]],
    run_ids: list[str],
    cutoff: float,
    values: tuple[str, ...],
) -> list[str]:
    """schema.delete_prunable_runs' guard: the runs of ``run_ids`` that exist,
    are prunable, and have no direct fork that is not."""
    return [
        r
        for r in run_ids
        if r in t.runs
        and _prunable(t.runs[r], cutoff, values)
        and all(_prunable(t.runs[c], cutoff, values) for c in children.get(r, []))
    ]


def _delete(t: Tables, run_ids: list[str]) -> Deleted:
    """Delete these runs with their steps, events and tool records."""
    records = t.records_of(run_ids)
    for key in records:
        del t.tool_results[key]
    steps = sum(len(t.steps.pop(r, {})) for r in run_ids)
    events = sum(len(t.events.pop(r, [])) for r in run_ids)
    gone = set(run_ids)  # schema.delete_run_signals: kept or taken, the run is gone
    for signal_id in [i for i, s in t.signals.items() if s["run_id"] in gone]:
        del t.signals[signal_id]
    for run_id in run_ids:  # schema.delete_run_stream, schema.delete_run_tools
        t.stream.pop(run_id, None)
        t.run_tools.pop(run_id, None)
    runs = tuple((r, RunStatus(t.runs.pop(r)["status"])) for r in run_ids)
    return Deleted(runs, RowCounts(steps, events, len(records)))


def _check_new_records(t: Tables, records: list[Row]) -> None:
    """Refuse records whose key is taken, or repeated among them."""
    seen: set[str] = set()
    for record in records:
        if record["key"] in seen or record["key"] in t.tool_results:
            raise StoreError(f"the tool record {record['key']!r} exists")
        seen.add(record["key"])
