"""The memory store's tables, and the one lock every method holds.

Each method of :class:`~harness.store.memory.MemoryStore` is one
transaction: it takes the store's lock, checks everything that could refuse
the write, and only then changes the tables, so a write that is refused
(a stale version, a step index taken, a NOT NULL column left empty) leaves
nothing behind, as a rolled-back SQL transaction would.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from harness.errors import RunNotFound
from harness.records import idempotency_key
from harness.store.memory.rows import Row


@dataclass
class Tables:
    """Every table, as rows (harness.store.memory.rows)."""

    #: Runs by run_id, in insertion order.
    runs: dict[str, Row] = field(default_factory=dict)
    #: Each run's steps by index.
    steps: dict[str, dict[int, Row]] = field(default_factory=dict)
    #: Each run's events, oldest (lowest id) first.
    events: dict[str, list[Row]] = field(default_factory=dict)
    #: Durable idempotency records by key.
    tool_results: dict[str, Row] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    #: Lane name to (probe_sent_at, delivered_before).
    lanes: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    #: Sweeps, oldest id first.
    sweeps: list[Row] = field(default_factory=list)
    #: The sweep lease: (holder, expires_at), once taken.
    sweep_lease: tuple[str | None, float | None] | None = None
    #: The agent catalog by (worker, agent).
    agents: dict[tuple[str, str], Row] = field(default_factory=dict)
    #: Kept signals by id (harness.store.Waits).
    signals: dict[int, Row] = field(default_factory=dict)
    #: Each run's stream (harness.store.Streams): (id, entry, at), oldest first.
    stream: dict[str, list[tuple[int, str, float]]] = field(default_factory=dict)
    #: The tools each run was offered, as JSON text (harness.store.OfferedTools).
    run_tools: dict[str, str] = field(default_factory=dict)
    #: The last id given to an event, a sweep, a signal, a stream entry (never
    #: reused, as a sequence).
    last_event_id: int = 0
    last_sweep_id: int = 0
    last_signal_id: int = 0
    last_stream_id: int = 0

    def run(self, run_id: str) -> Row:
        """The run's row. Raises RunNotFound."""
        row = self.runs.get(run_id)
        if row is None:
            raise RunNotFound(run_id)
        return row

    def step_at(self, row: Row, index: int | None = None) -> Row | None:
        """The step of the run ``row`` at ``index`` (its cursor if None)."""
        steps = self.steps.get(row["run_id"], {})
        return steps.get(row["cursor"] if index is None else index)

    def add_events(self, run_id: str, rows: list[Row]) -> None:
        """Append event rows to the run's recorder, each with the next id."""
        recorder = self.events.setdefault(run_id, [])
        for row in rows:
            self.last_event_id += 1
            recorder.append({"id": self.last_event_id, **row})

    def step_keys(self, run_ids: list[str]) -> set[str]:
        """The idempotency keys of these runs' steps."""
        return {idempotency_key(r, i) for r in run_ids for i in self.steps.get(r, {})}

    def records_of(self, run_ids: list[str]) -> list[str]:
        """The keys of the records of these runs' steps that these runs wrote
        (one under such a key that another run wrote stays with it)."""
        owners = set(run_ids)
        return [
            key
            for key in sorted(self.step_keys(run_ids))
            if key in self.tool_results and self.tool_results[key]["run_id"] in owners
        ]


class MemoryBase:
    """The state every part of the memory store works on."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tables = Tables()

    def table_sizes(self, run_id: str | None = None) -> dict[str, int]:
        """Rows in each run table, of every run or of ``run_id`` (what a test
        counts on an SQL store with ``SELECT count(*)``)."""
        with self._lock:
            t = self._tables
            runs = list(t.runs) if run_id is None else [run_id]
            records = t.tool_results.values()
            return {
                "harness_runs": sum(1 for r in runs if r in t.runs),
                "harness_steps": sum(len(t.steps.get(r, {})) for r in runs),
                "harness_events": sum(len(t.events.get(r, [])) for r in runs),
                "harness_tool_results": sum(
                    1 for r in records if run_id is None or r["run_id"] == run_id
                ),
                "harness_signals": sum(
                    1 for r in t.signals.values() if run_id is None or r["run_id"] == run_id
                ),
            }
