"""The run store's interface, and the checkpoint it applies atomically.

A :class:`Checkpoint` is everything one transition writes: the run row
(guarded by compare-and-swap on ``version``), step rows, new steps and
flight-recorder events. A store applies it in one transaction or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum, StrEnum
from typing import Any, ClassVar, Protocol

from harness.records import JSON, Approval, Event, Run, RunStatus, Step, StepKind, StepStatus


class _Keep(Enum):
    KEEP = "keep"


#: Marks a column a patch leaves as it is.
KEEP = _Keep.KEEP

#: The event of a model call charged after its run ended (:meth:`Store.add_late_usage`).
BILLED = "billed"


def _present(patch: object) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in fields(patch):  # type: ignore[arg-type]
        value = getattr(patch, f.name)
        if value is KEEP or f.name == "index":
            continue
        values[f.name] = value.value if isinstance(value, Enum) else value
    return values


@dataclass(frozen=True)
class RunPatch:
    """Columns of the run row to change; everything else is kept."""

    status: RunStatus | _Keep = KEEP
    cursor: int | _Keep = KEEP
    step_count: int | _Keep = KEEP
    owner: str | _Keep | None = KEEP
    lease_expires_at: float | _Keep | None = KEEP
    wake_at: float | _Keep | None = KEEP
    result: str | _Keep | None = KEEP
    error: str | _Keep | None = KEEP
    resends: int | _Keep = KEEP
    blocked: str | _Keep | None = KEEP
    input_tokens: int | _Keep = KEEP
    output_tokens: int | _Keep = KEEP
    cost_usd: float | _Keep = KEEP
    max_tokens: int | _Keep | None = KEEP
    max_cost_usd: float | _Keep | None = KEEP
    pause_requested: bool | _Keep = KEEP

    def values(self) -> dict[str, Any]:
        return _present(self)

    @classmethod
    def stopped(
        cls, status: RunStatus, error: str | None = None, result: str | _Keep | None = KEEP
    ) -> RunPatch:
        """A run leaving the movable states, for good (completed, failed,
        cancelled) or until an operator acts (waiting): unleased, and never
        woken by the sweeper."""
        return cls(
            status=status,
            error=error,
            result=result,
            owner=None,
            lease_expires_at=None,
            wake_at=None,
            # A pause asked for is moot once the run has ended (not while it waits).
            pause_requested=False if status.terminal else KEEP,
        )


@dataclass(frozen=True)
class StepPatch:
    """Columns of one step row to change. ``result`` is stored as JSON.
    ``attempts`` sets the count; ``bump_attempts`` adds one to the stored count."""

    index: int
    status: StepStatus | _Keep = KEEP
    attempts: int | _Keep = KEEP
    result: JSON | _Keep = KEEP
    error: str | _Keep | None = KEEP
    started_at: float | _Keep | None = KEEP
    finished_at: float | _Keep | None = KEEP
    retries: int | _Keep = KEEP
    approval: Approval | _Keep | None = KEEP
    args: dict[str, JSON] | _Keep = KEEP
    bump_attempts: bool = False

    def values(self) -> dict[str, Any]:
        values = _present(self)
        values.pop("bump_attempts")
        return values


@dataclass(frozen=True)
class EventDraft:
    """A flight-recorder row; its version is the checkpoint's new version."""

    to_status: str
    from_status: str | None = None
    step_index: int | None = None
    detail: str | None = None


@dataclass(frozen=True)
class ToolRecord:
    """A tool call's result for the durable idempotency record (first writer wins)."""

    key: str
    step_index: int
    tool: str
    result: JSON


@dataclass(frozen=True)
class Checkpoint:
    """One atomic transition of a run, guarded by ``expected_version``.

    ``tool_record``: the result of the call the step made, stored in the
    idempotency record in the same transaction as the step's result.
    """

    run_id: str
    expected_version: int
    worker: str | None
    now: float
    run: RunPatch = field(default_factory=RunPatch)
    steps: tuple[StepPatch, ...] = ()
    new_steps: tuple[Step, ...] = ()
    events: tuple[EventDraft, ...] = ()
    tool_record: ToolRecord | None = None


@dataclass(frozen=True)
class ClaimGuard:
    """The state a claim written without a load (:meth:`Store.claim_loaded`)
    must find, besides its version: the run running, unleased, not asked to
    pause and not a replay, of ``agent``, its cursor at ``cursor``, and the
    step there a PENDING call of ``tool`` after ``attempts`` attempts. The
    state in which :func:`harness.engine.transitions.claim_pending` is the
    claim the runner would write after a load.

    :meth:`holds` is the definition; the SQL store's statement
    (``schema.claim_guard``) is built from :data:`RUN_STATUS`,
    :data:`STEP_KIND` and :data:`STEP_STATUS`, and the contract suite checks
    that both agree on every backend (tests/contract/test_claim_guard.py)."""

    cursor: int
    agent: str
    tool: str
    attempts: int

    #: The statuses and kind the guard requires, whatever the hint.
    RUN_STATUS: ClassVar[RunStatus] = RunStatus.RUNNING
    STEP_KIND: ClassVar[StepKind] = StepKind.TOOL
    STEP_STATUS: ClassVar[StepStatus] = StepStatus.PENDING

    def holds(self, run: Run, version: int) -> bool:
        """Does ``run``, loaded with its step at the cursor, let a claim at
        ``version`` guarded so land?"""
        step = run.current
        return (
            run.version == version
            and run.status is self.RUN_STATUS
            and run.owner is None
            and not run.pause_requested
            and run.replay_of is None
            and run.cursor == self.cursor
            and run.agent == self.agent
            and step is not None
            and step.index == self.cursor
            and step.kind is self.STEP_KIND
            and step.status is self.STEP_STATUS
            and step.tool == self.tool
            and step.attempts == self.attempts
        )


@dataclass(frozen=True)
class PauseNote:
    """An operator's ask that a run stop at its next step boundary
    (``requested``), or its withdrawal, with its event: written beside the
    version, so a step in flight still records its result, and only while
    the run's status is one of ``while_status`` and its ask is not already
    so (:meth:`Store.request_pause`)."""

    run_id: str
    requested: bool
    while_status: frozenset[RunStatus]
    event: EventDraft
    worker: str
    now: float


@dataclass(frozen=True)
class ApprovalNote:
    """An operator's word on step ``index``, a call the run has not reached,
    (and the arguments to call it with, if edited), with its event: written
    beside the version, and only while the step is ``while_status`` and has
    no word yet (:meth:`Store.note_approval`)."""

    run_id: str
    index: int
    approval: Approval
    args: dict[str, JSON] | None
    while_status: StepStatus
    event: EventDraft
    worker: str
    now: float


class Store(Protocol):
    """What the runner, the sweeper and the CLI need from durable storage."""

    def create_run(
        self, run: Run, steps: Sequence[Step], wake_at: float, created: EventDraft
    ) -> tuple[Run, bool]:
        """Insert a run with its steps (the first model step; a fork's copied
        ones) and its creation event (harness.engine.transitions.created);
        return the existing run, untouched, if the id is taken."""

    def load(self, run_id: str, at: int | None = None) -> Run:
        """The run with the step at its cursor, in one round trip. Raises
        RunNotFound. ``at``: the cursor the caller expects (a step message's);
        a run whose cursor is elsewhere comes without its step. Knowing it
        lets PostgreSQL reuse the statement's plan."""

    def checkpoint(self, checkpoint: Checkpoint) -> int:
        """Apply atomically; return the new version. Raises StaleWriteError."""

    def claim_loaded(self, claim: Checkpoint, guard: ClaimGuard) -> tuple[Run, int] | None:
        """Apply ``claim`` only if the run is at its expected version and as
        ``guard`` says; return the run as it was just before (what
        :meth:`load` returned then) and the new version. None, with nothing
        written, if it is not so. One round trip on PostgreSQL."""

    def steps(self, run_id: str, start: int = 0, limit: int | None = None) -> list[Step]:
        """A run's steps in order: every one, or ``limit`` from index ``start``."""

    def events(self, run_id: str) -> list[Event]:
        """The run's flight recorder, oldest first."""

    def query_runs(
        self,
        limit: int,
        *,
        status: RunStatus | None = None,
        agent: str | None = None,
        created_before: float | None = None,
        created_after: float | None = None,
        before: tuple[float, str] | None = None,
        forked_from: str | None = None,
        replay_of: str | None = None,
        replays: bool | None = None,
    ) -> list[Run]:
        """A page of runs, each with the step at its cursor (``Run.current``),
        newest first by (created_at, run_id); the filters
        combine, ``created_after`` inclusive, ``created_before`` exclusive.
        ``before``: a keyset (created_at, run_id), only the runs after it in
        this order (the previous page's last run: keyset pagination).
        ``forked_from``: only the forks of that run; ``replay_of``: only its
        replays; ``replays``: only replays (True), or only other runs (False)."""

    def events_after(
        self, run_id: str, after_id: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """The run's events with an id above ``after_id`` (all if None), oldest
        first, at most ``limit`` of them."""

    def due_runs(
        self, now: float, limit: int = 500, delivered: Delivered | None = None
    ) -> list[Run]:
        """Movable runs whose lease expired, or whose next message is overdue
        and, if ``delivered`` is given, no longer possibly queued."""

    def lanes(self) -> dict[str, Lane]:
        """The delivery probes' record, by lane (harness.engine.probes)."""

    def note_probe_sent(self, lane: str, at: float) -> None:
        """A probe was sent down ``lane`` at ``at``."""

    def note_delivered(self, lane: str, sent_at: float) -> None:
        """A worker took the probe sent at ``sent_at`` off ``lane``: raise the
        lane's ``delivered_before`` to it (never lower it)."""

    def record_sweep(self, sweep: Sweep) -> None:
        """Record a sweep that went through; only the newest ones are kept
        (:data:`SWEEPS_KEPT`, and the newest of each kind)."""

    def last_sweep(self, kinds: tuple[SweepKind, ...] | None = None) -> Sweep | None:
        """The sweep that started last, of one of ``kinds`` (any if None);
        None if none was recorded."""

    def sweeps(self, limit: int = 100) -> list[Sweep]:
        """The sweeps recorded last, newest first."""

    def take_sweep_lease(self, holder: str, now: float, until: float) -> bool:
        """Take, or renew, the lease of the worker that sweeps while beat does
        not (harness.worker.takeover), until ``until``: True if ``holder``
        holds it now, False if another does and it has not lapsed."""

    def release_sweep_lease(self, holder: str) -> None:
        """Give the lease up, if ``holder`` holds it."""

    def event_counts(self) -> dict[str, int]:
        """How many events of each kind were recorded (for stats)."""

    def ping(self) -> None:
        """Reach the database and back, reading no table (a health check):
        :class:`~harness.errors.StoreError` if it does not answer."""

    def run_counts(self) -> dict[str, int]:
        """How many runs are in each status."""

    def counters(self) -> dict[str, int]:
        """Durable counters of things that leave no row (stale writes rejected)."""

    def running_steps_started_before(self, cutoff: float) -> int:
        """How many steps are RUNNING since before ``cutoff`` (the stuck-step alert)."""

    def oldest_running_step_started_at(self) -> float | None:
        """When the oldest step RUNNING in a run still moving started; None if none."""

    def get_tool_result(self, key: str) -> tuple[bool, JSON]:
        """(found, result) of the durable idempotency record."""

    def put_tool_result(
        self, key: str, run_id: str, step_index: int, tool: str, result: JSON, now: float
    ) -> JSON:
        """Store a result unless one exists; return whichever is stored."""

    def request_pause(self, note: PauseNote) -> None:
        """Ask a run to stop at its next step boundary, or withdraw the ask,
        with the note's event, without moving its version, so a step in
        flight still records its result. Raises NoteRefused, writing
        nothing, if the run is no longer as the note requires."""

    def note_approval(self, note: ApprovalNote) -> None:
        """Record an operator's word on a pending call the run has not reached
        (and the arguments to call it with, if edited), with the note's event,
        without moving the version. Once: raises NoteRefused, writing
        nothing, if the step already has a word, or is no longer pending."""

    def add_late_usage(
        self,
        run_id: str,
        index: int,
        result: JSON,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float,
        worker: str,
        now: float,
        detail: str,
    ) -> bool:
        """A model call that returned after its run ended (cancelled, or ended
        by another worker while the call was under way) was paid for: put its
        response on its step (``result``), add its usage to the run's, and
        record an event, in one transaction, without moving the version. Once:
        only while the run has ended and the step, a model step, has no result
        yet. False, writing nothing, otherwise (a run still going is charged
        by the result checkpoint of whoever carries the step on)."""

    def reset(self) -> None:
        """Delete every run, step, event and record (tests, the demo)."""

    def heartbeat_store(self) -> Store:
        """This store on connections of its own, for lease renewals, so a renewal
        never waits behind step threads; made on first use, the same object every
        time, closed and forgotten with this store. A store without a connection
        pool may return itself."""

    def close(self) -> None:
        """Release connections (the heartbeat store's too)."""

    def forget_connections(self) -> None:
        """After a fork: drop the parent's connections (the heartbeat store's too)
        without closing them."""

    # -- export and import (harness.replay.archive) ----------------------------

    def run_rows(self, run_id: str) -> RunRows:
        """The run as its tables hold it, read in one snapshot (a run moving
        meanwhile is seen before or after a checkpoint, never halfway).
        Raises RunNotFound."""

    def import_run(self, rows: RunRows) -> bool:
        """Insert a run with its steps, events (in order, new ids) and
        idempotency records in one transaction. False, writing nothing, if the
        run id is taken; any failure writes nothing (StoreError)."""

    # -- prune: retention (harness.replay.prune) -------------------------------

    def prune_candidates(
        self,
        cutoff: float,
        statuses: tuple[RunStatus, ...],
        limit: int,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        """Up to ``limit`` runs of one of ``statuses`` (terminal ones) last
        updated at or before ``cutoff``, oldest first by (created_at, run_id),
        strictly after the keyset ``after``; on the index (created_at, run_id)."""

    def fork_protected(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> set[str]:
        """Which of ``run_ids`` are fork ancestors of a run that would be kept:
        one with a descendant not of ``statuses`` or updated after ``cutoff``."""

    def count_run_rows(self, run_ids: Sequence[str]) -> RowCounts:
        """How many steps, events and tool records these runs have (a dry run)."""

    def delete_runs(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> Deleted:
        """Delete these runs with their steps, events and tool records, in one
        transaction; only those still of ``statuses``, untouched since
        ``cutoff``, and with no fork child that is neither (a fork made meanwhile).
        Forks of the runs deleted go too, under the same conditions (a fork
        subtree goes whole); if one may not, it would be left naming a run
        deleted: nothing is deleted, and ``kept_children`` names such runs."""

    # -- fork (harness.replay.fork) ---------------------------------------------

    def tool_records(self, keys: Sequence[str]) -> list[ToolRecord]:
        """The durable idempotency records under ``keys`` (those that exist), by
        step index: what a fork copies under its own keys."""

    def create_fork(
        self,
        run: Run,
        steps: Sequence[Step],
        records: Sequence[ToolRecord],
        wake_at: float,
        created: EventDraft,
    ) -> tuple[Run, bool]:
        """Insert a fork (``run.forked_from`` set) with its steps, its creation
        event (which says what it was forked from) and the idempotency
        records of its copied steps, in one transaction; return the existing
        run, untouched, if the id is taken."""

    # -- agent catalog (harness.catalog) -----------------------------------------

    def publish_agents(
        self, worker: str, agents: Sequence[PublishedAgent], forget_before: float
    ) -> None:
        """Make ``agents`` the worker's rows, in one transaction: each written
        (over what the worker published before), the worker's others deleted,
        and any worker's rows last seen before ``forget_before`` forgotten."""

    def withdraw_agents(self, worker: str) -> None:
        """Delete the worker's rows (it stops)."""

    def published_agents(self, seen_since: float) -> list[PublishedAgent]:
        """Every worker's rows last seen at ``seen_since`` or later."""


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


@dataclass(frozen=True)
class Lane:
    """The delivery probes' record of one lane (harness.engine.probes): when
    its last probe was sent, and the newest probe a worker took off it
    (None: none yet)."""

    probe_sent_at: float | None = None
    delivered_before: float | None = None


class SweepKind(StrEnum):
    """Who ran a sweep."""

    BEAT = "beat"  # celery beat, in its own process (harness.worker.sweeper)
    TASK = "task"  # a tasks.sweep message (another beat scheduler, or by hand)
    COMMAND = "command"  # harness sweep, or a sweep called from Python
    WORKER = "worker"  # a worker that took the sweep over (harness.worker.takeover)


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
