"""Prune on SQL (harness.store.Retention): candidates, the fork ancestors
kept, the rows a batch would delete, and the guarded delete itself."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from harness.records import Run, RunStatus, idempotency_key
from harness.store import mapping, schema
from harness.store.sql.base import SQLBase
from harness.store.sql.rows import status_values
from harness.store.values import Deleted, RowCounts

#: Tool record keys per statement when pruning (bound parameters are limited).
_PRUNE_KEYS = 1000


class SQLRetention(SQLBase):
    """Prune (harness.store.Retention)."""

    def prune_candidates(
        self,
        cutoff: float,
        statuses: tuple[RunStatus, ...],
        limit: int,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        query = schema.prune_candidates(cutoff, status_values(statuses), limit, after)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [mapping.to_run(r) for r in rows]

    def fork_protected(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> set[str]:
        if not run_ids:
            return set()
        query = schema.fork_protected(list(run_ids), cutoff, status_values(statuses))
        return set(self._read(lambda conn: conn.execute(query).scalars().all()))

    def count_run_rows(self, run_ids: Sequence[str]) -> RowCounts:
        if not run_ids:
            return RowCounts()
        ids = list(run_ids)

        def count(conn: Connection) -> RowCounts:
            row = conn.execute(schema.count_run_rows(ids)).one()
            records = sum(
                int(conn.execute(schema.count_tool_records(keys, ids)).scalar_one())
                for keys in _step_keys(conn, ids)
            )
            return RowCounts(int(row.steps), int(row.events), records)

        return self._read(count)

    def delete_runs(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> Deleted:
        if not run_ids:
            return Deleted((), RowCounts())
        values = status_values(statuses)

        def delete(conn: Connection) -> Deleted:
            # The run rows first, under the guard: only runs actually deleted
            # lose their rows (tool records before steps: keys come from steps).
            query = schema.delete_prunable_runs(list(run_ids), cutoff, values)
            gone = [(str(r), RunStatus(s)) for r, s in conn.execute(query).all()]
            # The guard sees one generation down, and on PostgreSQL only forks
            # committed before the DELETE began. So look again, each time in a
            # new statement (READ COMMITTED: a new snapshot), for runs still
            # here whose origin was just deleted: each goes too, under the same
            # guard (a fork subtree goes whole, in one batch); one that may not
            # is a kept child, and the whole batch rolls back. Sound with
            # create_fork's lock on the origin: a fork that locked P (FOR KEY
            # SHARE) and inserted C holds our DELETE of P until it commits, and
            # the next statement sees C; if our DELETE of P came first, the
            # fork's lock waits for this transaction and finds P gone (it
            # refuses), or, if we roll back, finds P and goes ahead. SQLite's
            # write transactions are serial: there the guard sees every fork.
            frontier = [r for r, _ in gone]
            while frontier:
                children = list(conn.execute(schema.fork_children_of(frontier)).scalars())
                if not children:
                    break
                query = schema.delete_prunable_runs(children, cutoff, values)
                more = [(str(r), RunStatus(s)) for r, s in conn.execute(query).all()]
                frontier = [r for r, _ in more]
                kept = sorted(set(children) - set(frontier))
                if kept:
                    raise _KeptChildren(tuple(kept))
                gone += more
            ids = [r for r, _ in gone]
            if not ids:
                return Deleted((), RowCounts())
            records = sum(
                conn.execute(schema.delete_tool_records(keys, ids)).rowcount
                for keys in _step_keys(conn, ids)
            )
            events, steps = (conn.execute(d).rowcount for d in schema.delete_run_rows(ids))
            conn.execute(schema.delete_run_signals(ids))  # kept or taken: the run is gone
            conn.execute(schema.delete_run_stream(ids))
            conn.execute(schema.delete_run_tools(ids))
            conn.execute(schema.delete_run_blobs(ids))
            return Deleted(tuple(gone), RowCounts(steps, events, records))

        try:
            deleted = self._write(delete)
        except _KeptChildren as kept:
            return Deleted((), RowCounts(), kept_children=kept.run_ids)
        self.blobs.remove(r for r, _ in deleted.runs)  # their files, once the rows are gone
        return deleted


class _KeptChildren(Exception):
    """Rolls a prune batch back: these runs are forks of runs it deleted."""

    def __init__(self, run_ids: tuple[str, ...]) -> None:
        super().__init__(", ".join(run_ids))
        self.run_ids = run_ids


def _step_keys(conn: Connection, run_ids: list[str]) -> list[list[str]]:
    """The idempotency keys of these runs' steps, in chunks of :data:`_PRUNE_KEYS`."""
    rows = conn.execute(schema.select_step_keys(run_ids)).all()
    keys = [idempotency_key(run_id, idx) for run_id, idx in rows]
    return [keys[i : i + _PRUNE_KEYS] for i in range(0, len(keys), _PRUNE_KEYS)]
