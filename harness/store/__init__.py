"""Durable storage of runs: the store's interface, and the values it moves.

- :mod:`harness.store.checkpoint`: the :class:`Checkpoint` one transition
  writes, which a store applies in one transaction or not at all.
- :mod:`harness.store.protocols`: the store's parts by concern (runs, notes
  beside the version, tool records, lanes, sweeps, stats, retention,
  archives, the agent catalog) and :class:`Store`, their union.
- :mod:`harness.store.values`: the records those parts take and return,
  and :class:`RunQuery`.
- Backends: :mod:`harness.store.sql` (SQLite, PostgreSQL; its tables and
  statements in :mod:`harness.store.schema`) and :mod:`harness.store.memory`
  (in process, for tests), both mapping rows to records through
  :mod:`harness.store.mapping`.
"""

from __future__ import annotations

from harness.store.checkpoint import (
    BILLED,
    KEEP,
    ApprovalNote,
    Checkpoint,
    ClaimGuard,
    Completion,
    EventDraft,
    PauseNote,
    RunPatch,
    StepPatch,
    ToolRecord,
)
from harness.store.protocols import (
    Archives,
    Catalog,
    Inbox,
    Lanes,
    OfferedTools,
    ReadStore,
    Retention,
    RunNotes,
    RunStore,
    Stats,
    Store,
    Streams,
    Sweeps,
    ToolRecords,
    Waits,
)
from harness.store.values import (
    MAX_PAGE,
    MESSAGE,
    SCHEDULED_SWEEPS,
    SWEEPS_KEPT,
    Deleted,
    Delivered,
    KeptSignal,
    Lane,
    OldestWait,
    PublishedAgent,
    PublishedTool,
    RowCounts,
    RunQuery,
    RunRows,
    SignalDraft,
    StreamEntry,
    StreamKind,
    Sweep,
    SweepKind,
    check_limit,
    decode_cursor,
    encode_cursor,
    keyset_cursor,
)

__all__ = [
    "BILLED",
    "KEEP",
    "MAX_PAGE",
    "MESSAGE",
    "SCHEDULED_SWEEPS",
    "SWEEPS_KEPT",
    "ApprovalNote",
    "Archives",
    "Catalog",
    "Checkpoint",
    "ClaimGuard",
    "Completion",
    "Deleted",
    "Delivered",
    "EventDraft",
    "Inbox",
    "KeptSignal",
    "Lane",
    "Lanes",
    "OfferedTools",
    "OldestWait",
    "PauseNote",
    "PublishedAgent",
    "PublishedTool",
    "ReadStore",
    "Retention",
    "RowCounts",
    "RunNotes",
    "RunPatch",
    "RunQuery",
    "RunRows",
    "RunStore",
    "SignalDraft",
    "Stats",
    "StepPatch",
    "Store",
    "StreamEntry",
    "StreamKind",
    "Streams",
    "Sweep",
    "SweepKind",
    "Sweeps",
    "ToolRecord",
    "ToolRecords",
    "Waits",
    "check_limit",
    "decode_cursor",
    "encode_cursor",
    "keyset_cursor",
]
