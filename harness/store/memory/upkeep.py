"""Tool records, lanes, sweeps, counts and the agent catalog in memory
(harness.store.protocols: ToolRecords, Lanes, Sweeps, Stats, Catalog).

The upserts and guards of their SQL statements (``ON CONFLICT`` clauses in
:mod:`harness.store.schema`) are written here as the same rules in Python.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from harness.records import JSON, RunStatus, StepStatus
from harness.store import mapping
from harness.store.checkpoint import ToolRecord
from harness.store.memory import rows
from harness.store.memory.rows import Row
from harness.store.memory.tables import MemoryBase
from harness.store.values import SWEEPS_KEPT, Lane, PublishedAgent, Sweep, SweepKind


class MemoryUpkeep(MemoryBase):
    """Everything but runs: records, lanes, sweeps, counts, the catalog."""

    # -- durable idempotency records (ToolRecords) -------------------------------

    def get_tool_result(self, key: str) -> tuple[bool, JSON]:
        with self._lock:
            row = self._tables.tool_results.get(key)
            return (False, None) if row is None else (True, json.loads(row["result"]))

    def put_tool_result(
        self, key: str, run_id: str, step_index: int, tool: str, result: JSON, now: float
    ) -> JSON:
        row = rows.record_row(run_id, ToolRecord(key, step_index, tool, result), now)
        with self._lock:
            stored = self._tables.tool_results.setdefault(key, row)
            # As SQLStore: the value given when it was stored now, the stored one otherwise.
            return result if stored is row else json.loads(stored["result"])

    def tool_records(self, keys: Sequence[str]) -> list[ToolRecord]:
        with self._lock:
            found = [self._tables.tool_results.get(k) for k in dict.fromkeys(keys)]
            records = [mapping.to_record(r) for r in found if r is not None]
        return sorted(records, key=lambda record: record.step_index)

    # -- delivery probes (Lanes) ---------------------------------------------------

    def lanes(self) -> dict[str, Lane]:
        with self._lock:
            return {name: Lane(*marks) for name, marks in self._tables.lanes.items()}

    def note_probe_sent(self, lane: str, at: float) -> None:
        with self._lock:
            _, delivered = self._tables.lanes.get(lane, (None, None))
            self._tables.lanes[lane] = (float(at), delivered)

    def note_delivered(self, lane: str, sent_at: float) -> None:
        with self._lock:
            sent, delivered = self._tables.lanes.get(lane, (None, None))
            # schema.note_delivered: raised to ``sent_at``, never lowered.
            newest = float(sent_at) if delivered is None else max(delivered, sent_at)
            self._tables.lanes[lane] = (sent, newest)

    # -- sweeps (Sweeps) -----------------------------------------------------------

    def record_sweep(self, sweep: Sweep) -> None:
        row = rows.sweep_row(sweep)
        with self._lock:
            t = self._tables
            t.last_sweep_id += 1
            t.sweeps.append({"id": t.last_sweep_id, **row})
            # schema.prune_sweeps: the newest SWEEPS_KEPT, and the newest of each kind.
            newest_of_kind = {r["kind"]: r["id"] for r in t.sweeps}
            oldest_kept = t.last_sweep_id - SWEEPS_KEPT
            t.sweeps = [
                r for r in t.sweeps if r["id"] > oldest_kept or r["id"] in newest_of_kind.values()
            ]

    def last_sweep(self, kinds: tuple[SweepKind, ...] | None = None) -> Sweep | None:
        wanted = None if kinds is None else {k.value for k in kinds}
        with self._lock:
            found = [r for r in self._tables.sweeps if wanted is None or r["kind"] in wanted]
        if not found:
            return None
        return mapping.to_sweep(max(found, key=lambda r: (r["started_at"], r["id"])))

    def sweeps(self, limit: int = 100) -> list[Sweep]:
        with self._lock:
            newest = list(reversed(self._tables.sweeps))[:limit]
        return [mapping.to_sweep(r) for r in newest]

    def take_sweep_lease(self, holder: str, now: float, until: float) -> bool:
        with self._lock:
            lease = self._tables.sweep_lease
            if lease is not None:
                held_by, expires = lease
                # schema.take_sweep_lease: free, the holder's own, or lapsed.
                lapsed = expires is not None and expires < now
                if not (held_by is None or held_by == holder or lapsed):
                    return False
            self._tables.sweep_lease = (holder, float(until))
            return True

    def release_sweep_lease(self, holder: str) -> None:
        with self._lock:
            lease = self._tables.sweep_lease
            if lease is not None and lease[0] == holder:
                self._tables.sweep_lease = (None, None)

    # -- counts (Stats) --------------------------------------------------------------

    def event_counts(self) -> dict[str, int]:
        with self._lock:
            recorders = list(self._tables.events.values())
            return dict(Counter(e["to_status"] for events in recorders for e in events))

    def run_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(Counter(r["status"] for r in self._tables.runs.values()))

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._tables.counters)

    def running_steps_started_before(self, cutoff: float) -> int:
        return sum(1 for started in self._running_steps_started() if started < cutoff)

    def oldest_running_step_started_at(self) -> float | None:
        return min(self._running_steps_started(), default=None)

    def _running_steps_started(self) -> list[float]:
        """schema.upkeep._running_step_started_at: for each running run, its step at
        the cursor's start if that step is RUNNING (and has a start)."""
        with self._lock:
            t = self._tables
            found = []
            for run in t.runs.values():
                if run["status"] != RunStatus.RUNNING.value:
                    continue
                step = t.step_at(run)
                if step is None or step["status"] != StepStatus.RUNNING.value:
                    continue
                if step["started_at"] is not None:
                    found.append(step["started_at"])
            return found

    # -- the agent catalog (Catalog) -----------------------------------------------------

    def publish_agents(
        self, worker: str, agents: Sequence[PublishedAgent], forget_before: float
    ) -> None:
        published = [rows.agent_row(a) for a in agents]
        keep = {a.agent for a in agents}
        with self._lock:
            t = self._tables
            t.agents = {
                key: row
                for key, row in t.agents.items()
                if row["last_seen"] >= forget_before and (key[0] != worker or key[1] in keep)
            }
            for row in published:
                t.agents[(row["worker"], row["agent"])] = row

    def withdraw_agents(self, worker: str) -> None:
        with self._lock:
            agents = self._tables.agents
            self._tables.agents = {k: r for k, r in agents.items() if k[0] != worker}

    def published_agents(self, seen_since: float) -> list[PublishedAgent]:
        with self._lock:
            found: list[Row] = [
                r for r in self._tables.agents.values() if r["last_seen"] >= seen_since
            ]
        return [mapping.to_published(r) for r in found]
