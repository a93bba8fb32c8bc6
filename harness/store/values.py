"""Values the store protocols take and return, beside the checkpoint.

Frozen records for the agent catalog, export and import, delivery lanes,
sweeps, prune, and :class:`RunQuery` (which runs a listing reads), so that
the protocols (harness.store.protocols) and every backend share one definition.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from harness.errors import BadCursor
from harness.records import JSON, Run, RunStatus


@dataclass(frozen=True)
class PublishedTool:
    """A tool as the agent catalog lists it."""

    name: str
    effect: str
    requires_approval: bool

    def to_dict(self) -> dict[str, JSON]:
        return {
            "name": self.name,
            "effect": self.effect,
            "requires_approval": self.requires_approval,
        }


@dataclass(frozen=True)
class PublishedAgent:
    """One worker's word on one agent it carries (harness.catalog): its
    definition's hash, its tools, when the worker first published
    (``started_at``) and last refreshed it (``last_seen``), epoch seconds."""

    worker: str
    agent: str
    definition_hash: str
    tools: tuple[PublishedTool, ...]
    started_at: float
    last_seen: float


@dataclass(frozen=True)
class RunRows:
    """A run as its tables hold it, for export and import.

    Rows are column name to value, generic on purpose: a column added to a
    table travels in an export without a change here. JSON columns
    (:data:`harness.store.schema.JSON_COLUMNS`) hold decoded values, whole
    (a blob's read back); the columns that only say where a value is stored
    (:data:`harness.store.schema.STORAGE_COLUMNS`) are left out. Events
    are in flight-recorder order, without their ids (a store assigns them);
    steps by index; tool records by step index.
    """

    run: Mapping[str, Any]
    steps: tuple[Mapping[str, Any], ...]
    events: tuple[Mapping[str, Any], ...]
    tool_records: tuple[Mapping[str, Any], ...]
    #: The run's signals (harness_signals), taken or not, oldest first,
    #: without their ids (a store assigns them). Added with migration 0014.
    signals: tuple[Mapping[str, Any], ...] = ()
    #: The record of the tools the run was offered by its toolsets
    #: (harness_run_tools, harness.engine.offering), if it has one. Migration 0017.
    offered_tools: Any = None


@dataclass(frozen=True)
class Lane:
    """The delivery probes' record of one lane (harness.engine.probes): when
    its last probe was sent, and the newest probe a worker took off it
    (None: none yet)."""

    probe_sent_at: float | None = None
    delivered_before: float | None = None


class SweepKind(StrEnum):
    """Who ran a sweep."""

    BEAT = "beat"  # celery beat, in its own process (harness.celery.sweeper)
    TASK = "task"  # a tasks.sweep message (another beat scheduler, or by hand)
    COMMAND = "command"  # harness sweep, or a sweep called from Python
    WORKER = "worker"  # a worker that took the sweep over (harness.celery.takeover)


#: Kinds that come on a schedule: while one of them sweeps, no worker does.
SCHEDULED_SWEEPS = (SweepKind.BEAT, SweepKind.TASK)
#: Sweeps a store keeps (the newest of each kind is kept besides).
SWEEPS_KEPT = 1000


@dataclass(frozen=True)
class Sweep:
    """One sweep that went through: who ran it (``worker``: a process id, or a
    worker's node name and pid), the time it judged runs by (its start), when
    it ended, and how many runs it re-sent."""

    kind: SweepKind
    worker: str
    started_at: float
    finished_at: float
    redispatched: int = 0


@dataclass(frozen=True)
class Delivered:
    """Which overdue runs may still have their step message queued
    (harness.engine.probes), so the sweeper leaves them be: an unleased run
    (no owner: its message took the ``normal`` lane) or one the sweeper
    re-sent (owner ``recovery_owner``: the ``recovery`` lane), last written
    at or after the time its lane names, and not due before ``oldest``. A
    lane with no time (None) holds nothing back."""

    recovery_owner: str
    oldest: float
    normal: float | None = None
    recovery: float | None = None


@dataclass(frozen=True)
class RowCounts:
    """Rows of some runs, by table: what a prune deletes, or would."""

    steps: int = 0
    events: int = 0
    tool_records: int = 0

    def __add__(self, other: RowCounts) -> RowCounts:
        return RowCounts(
            self.steps + other.steps,
            self.events + other.events,
            self.tool_records + other.tool_records,
        )


@dataclass(frozen=True)
class Deleted:
    """What :meth:`Store.delete_runs` deleted: each run as (run_id, status), and their rows."""

    runs: tuple[tuple[str, RunStatus], ...]
    rows: RowCounts
    #: Forks (still there) of runs the batch deleted, made while it ran: the
    #: batch was rolled back, nothing deleted (``runs`` is empty).
    kept_children: tuple[str, ...] = ()


# -- listing runs (harness.reads) -------------------------------------------------

#: The most runs or events one page may hold.
MAX_PAGE = 1000


def check_limit(limit: int) -> None:
    """A page holds 1 to :data:`MAX_PAGE` items: :class:`BadCursor` otherwise."""
    if not 1 <= limit <= MAX_PAGE:
        raise BadCursor(f"a page holds 1 to {MAX_PAGE} items, not {limit}")


@dataclass(frozen=True)
class RunQuery:
    """Which runs to list. Filters combine; ``created_after`` is inclusive and
    ``created_before`` exclusive (epoch seconds). ``cursor``: the
    ``next_cursor`` of the previous page, None for the first."""

    status: RunStatus | None = None
    agent: str | None = None
    created_before: float | None = None
    created_after: float | None = None
    limit: int = 50
    cursor: str | None = None
    #: Only the forks of this run (``harness list --forked-from``).
    forked_from: str | None = None
    #: Only the replays of this run (``harness list --replay-of``).
    replay_of: str | None = None
    #: Only replays (True), or only runs that are not (False): both if None.
    replays: bool | None = None

    def __post_init__(self) -> None:
        check_limit(self.limit)

    def keyset(self) -> tuple[float, str] | None:
        """The (created_at, run_id) the page starts strictly after, read from
        ``cursor``; None for the first page. Raises :class:`BadCursor`."""
        return None if self.cursor is None else decode_cursor(self.cursor)


def keyset_cursor(created_at: float, run_id: str) -> str:
    """The opaque cursor of the page after the run (``created_at``, ``run_id``)."""
    raw = json.dumps([created_at, run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def encode_cursor(run: Run) -> str:
    """The opaque cursor of the page after ``run``."""
    return keyset_cursor(run.created_at, run.run_id)


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The keyset (created_at, run_id) that ``cursor`` names. Raises :class:`BadCursor`."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, run_id = json.loads(raw)
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError):
        raise BadCursor(f"not a cursor of this listing: {cursor!r}") from None
    valid_time = isinstance(created_at, int | float) and not isinstance(created_at, bool)
    if not valid_time or not isinstance(run_id, str):
        raise BadCursor(f"not a cursor of this listing: {cursor!r}")
    return float(created_at), run_id


#: The name under which a user's message waits for a run's next model turn.
MESSAGE = "@message"


@dataclass(frozen=True)
class SignalDraft:
    """A signal to keep (:meth:`Store.keep_signal`): ``name`` (a step's own
    answer that came before the step deferred is kept under
    ``"@step:<index>"``), its data or error, and the sender's id (a retry
    with the same id is not a second signal)."""

    run_id: str
    name: str
    data: JSON
    error: str | None
    signal_id: str | None
    now: float


@dataclass(frozen=True)
class OldestWait:
    """The deferred call of a waiting run that has waited longest
    (:meth:`Store.oldest_wait`): its run, its step, and when it started."""

    run_id: str
    step: int
    since: float


@dataclass(frozen=True)
class KeptSignal:
    """A signal kept for a run and not yet taken by a step."""

    id: int
    run_id: str
    name: str
    data: JSON
    error: str | None
    signal_id: str | None
    created_at: float

    def to_dict(self) -> dict[str, JSON]:
        return {
            "id": self.id,
            "name": self.name,
            "data": self.data,
            "error": self.error,
            "signal_id": self.signal_id,
            "created_at": self.created_at,
        }


class StreamKind(StrEnum):
    """What a stream entry says (harness.streams)."""

    #: A piece of the answer's text, as the provider streamed it.
    TOKEN = "token"
    #: The pieces of this attempt so far will not be recorded.
    DISCARD = "discard"


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a run's stream: a piece of a model step's answer as it is
    written (``token``), or word that an attempt's pieces will not be
    recorded (``discard``). ``attempt`` counts every call of the step (its
    attempts and its retries), so no two calls share one."""

    step: int
    attempt: int
    kind: StreamKind
    text: str = ""

    def encode(self) -> str:
        """As the stream keeps it: JSON, ASCII only, so any column and any
        Redis client hold it (a lone surrogate, a NUL escaped)."""
        return json.dumps([self.step, self.attempt, self.kind.value, self.text])

    @classmethod
    def decode(cls, data: str | bytes) -> StreamEntry:
        step, attempt, kind, text = json.loads(data)
        return cls(int(step), int(attempt), StreamKind(kind), str(text))
