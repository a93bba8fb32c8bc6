"""Everything on SQL but runs and their archives: durable idempotency
records, delivery lanes, sweeps and the sweep lease, counts, the agent
catalog (harness.store.protocols: ToolRecords, Lanes, Sweeps, Stats,
Catalog), one mixin each."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from harness.records import JSON
from harness.store import mapping, schema
from harness.store.checkpoint import ToolRecord
from harness.store.sql.base import SQLBase
from harness.store.sql.rows import record_row, whole_records
from harness.store.values import SWEEPS_KEPT, Lane, PublishedAgent, Sweep, SweepKind

#: Execution option: keep an INSERT's rowcount (-1 on psycopg otherwise).
_KEEP_ROWCOUNT = {"preserve_rowcount": True}
#: Keys per ``IN`` list when reading idempotency records (SQLite's bound
#: parameters are limited; PostgreSQL plans long lists slowly).
_KEYS_PER_STATEMENT = 500
#: The one row of the sweep lease table (harness.celery.takeover).
_SWEEP_LEASE = "takeover"


class SQLToolRecords(SQLBase):
    """Durable idempotency records (harness.store.ToolRecords)."""

    def get_tool_result(self, key: str) -> tuple[bool, JSON]:
        def read(conn: Connection) -> Mapping[str, Any] | None:
            row = conn.execute(schema.select_tool_result(key)).mappings().first()
            return None if row is None else self.blobs.fill(conn, whole_records([row]))[0]

        row = self._read(read)
        return (False, None) if row is None else (True, json.loads(row["result"]))

    def put_tool_result(
        self, key: str, run_id: str, step_index: int, tool: str, result: JSON, now: float
    ) -> JSON:
        batch = self.blobs.batch()
        values = record_row(run_id, ToolRecord(key, step_index, tool, result), now, batch)
        blobs = self.blobs.stage(batch)

        def insert_or_read(conn: Connection) -> JSON:
            statement = schema.insert_tool_result_unless_taken(self.dialect)
            # An INSERT's rowcount is -1 on psycopg unless asked to be kept.
            if conn.execute(statement, values, execution_options=_KEEP_ROWCOUNT).rowcount == 1:
                self.blobs.insert(conn, self.dialect, blobs)
                return result
            row = conn.execute(schema.select_tool_result(key)).mappings().one()
            return json.loads(self.blobs.fill(conn, whole_records([row]))[0]["result"])

        # Safe to retry after a lost connection: it never overwrites a stored result.
        return self._write(insert_or_read)

    def tool_records(self, keys: Sequence[str]) -> list[ToolRecord]:
        def read(conn: Connection) -> list[ToolRecord]:
            found = []
            for start in range(0, len(keys), _KEYS_PER_STATEMENT):
                chunk = list(keys[start : start + _KEYS_PER_STATEMENT])
                rows = conn.execute(schema.select_tool_records(chunk)).mappings().all()
                found += [mapping.to_record(r) for r in self.blobs.fill(conn, whole_records(rows))]
            return found

        return sorted(self._read(read), key=lambda record: record.step_index)


class SQLLanes(SQLBase):
    """Delivery probes (harness.store.Lanes)."""

    def lanes(self) -> dict[str, Lane]:
        rows = self._read(lambda conn: conn.execute(schema.select_lanes()).all())
        return {name: Lane(sent, delivered) for name, sent, delivered in rows}

    def note_probe_sent(self, lane: str, at: float) -> None:
        self._write(lambda conn: conn.execute(schema.note_probe_sent(self.dialect, lane, at)))

    def note_delivered(self, lane: str, sent_at: float) -> None:
        self._write(lambda conn: conn.execute(schema.note_delivered(self.dialect, lane, sent_at)))


class SQLSweeps(SQLBase):
    """Sweeps and the sweep lease (harness.store.Sweeps)."""

    def record_sweep(self, sweep: Sweep) -> None:
        row = mapping.sweep_row(sweep)

        def insert(conn: Connection) -> None:
            conn.execute(schema.insert_sweep(), [row])
            conn.execute(schema.prune_sweeps(SWEEPS_KEPT))

        self._write(insert)

    def last_sweep(self, kinds: tuple[SweepKind, ...] | None = None) -> Sweep | None:
        query = schema.last_sweep(None if kinds is None else tuple(k.value for k in kinds))
        row = self._read(lambda conn: conn.execute(query).mappings().first())
        return None if row is None else mapping.to_sweep(row)

    def sweeps(self, limit: int = 100) -> list[Sweep]:
        query = schema.select_sweeps(limit)
        return [
            mapping.to_sweep(r)
            for r in self._read(lambda conn: conn.execute(query).mappings().all())
        ]

    def take_sweep_lease(self, holder: str, now: float, until: float) -> bool:
        statement = schema.take_sweep_lease(self.dialect, _SWEEP_LEASE, holder, now, until)

        def take(conn: Connection) -> bool:
            # An INSERT's rowcount is -1 on psycopg unless asked to be kept.
            return bool(conn.execute(statement, execution_options=_KEEP_ROWCOUNT).rowcount == 1)

        return self._write(take)

    def release_sweep_lease(self, holder: str) -> None:
        statement = schema.release_sweep_lease(_SWEEP_LEASE, holder)
        self._write(lambda conn: conn.execute(statement))


class SQLStats(SQLBase):
    """Counts for metrics and health (harness.store.Stats)."""

    def event_counts(self) -> dict[str, int]:
        rows = self._read(lambda conn: conn.execute(schema.count_events_by_kind()).all())
        return {str(kind): int(count) for kind, count in rows}

    def run_counts(self) -> dict[str, int]:
        rows = self._read(lambda conn: conn.execute(schema.count_runs_by_status()).all())
        return {str(status): int(count) for status, count in rows}

    def counters(self) -> dict[str, int]:
        rows = self._read(lambda conn: conn.execute(schema.select_counters()).all())
        return {str(name): int(value) for name, value in rows}

    def running_steps_started_before(self, cutoff: float) -> int:
        query = schema.count_running_steps_started_before(cutoff)
        return int(self._read(lambda conn: conn.execute(query).scalar_one()))

    def oldest_running_step_started_at(self) -> float | None:
        query = schema.oldest_running_step()
        started: float | None = self._read(lambda conn: conn.execute(query).scalar())
        return started


class SQLCatalog(SQLBase):
    """The agent catalog (harness.store.Catalog)."""

    def publish_agents(
        self, worker: str, agents: Sequence[PublishedAgent], forget_before: float
    ) -> None:
        rows = [mapping.agent_row(a) for a in agents]
        keep = [a.agent for a in agents]

        def publish(conn: Connection) -> None:
            conn.execute(schema.forget_agents_before(forget_before))
            conn.execute(schema.delete_agents_of(worker, keep))
            if rows:
                conn.execute(schema.upsert_agents(self.dialect), rows)

        self._write(publish)

    def withdraw_agents(self, worker: str) -> None:
        self._write(lambda conn: conn.execute(schema.delete_agents_of(worker)))

    def published_agents(self, seen_since: float) -> list[PublishedAgent]:
        query = schema.select_agents_seen_since(seen_since)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [mapping.to_published(r) for r in rows]
