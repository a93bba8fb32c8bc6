"""The store's protocols: small ones by concern, and :class:`Store`, their union.

A caller annotates the part it uses (the read service takes :class:`ReadStore`,
the catalog :class:`Catalog`), so what it needs from storage is visible in its
signature; a backend implements :class:`Store` whole. Two backends do:
:class:`harness.store.sql.SQLStore` (SQLite, PostgreSQL) and
:class:`harness.store.memory.MemoryStore` (tests, no database), and both pass
one contract suite (tests/contract).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from harness.records import JSON, Event, Run, RunStatus, Step
from harness.store.checkpoint import (
    ApprovalNote,
    Checkpoint,
    ClaimGuard,
    Completion,
    EventDraft,
    PauseNote,
    ToolRecord,
)
from harness.store.values import (
    Deleted,
    Delivered,
    KeptSignal,
    Lane,
    OldestWait,
    PublishedAgent,
    RowCounts,
    RunQuery,
    RunRows,
    SignalDraft,
    StreamEntry,
    Sweep,
    SweepKind,
)


class RunStore(Protocol):
    """The run store proper: what the runner, the sweeper and the reads
    need. Runs with their steps and flight recorder, each run written by
    compare-and-swap on its version (:meth:`checkpoint`), and the runs due a
    re-dispatch; the store's own connections."""

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

    def events_after(
        self, run_id: str, after_id: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """The run's events with an id above ``after_id`` (all if None), oldest
        first, at most ``limit`` of them."""

    def events_after_runs(self, after: Mapping[str, int], limit: int) -> dict[str, list[Event]]:
        """:meth:`events_after` for each run of ``after`` (run id: event id)
        at once, ``limit`` at most for each: the runs with none are left out.
        What a process's followers of many runs read in one round trip."""

    def query_runs(self, query: RunQuery, limit: int | None = None) -> list[Run]:
        """The runs ``query`` selects, each with the step at its cursor
        (``Run.current``), newest first by (created_at, run_id), strictly after
        the keyset its cursor names (keyset pagination), at most ``limit``
        (``query.limit`` if None: the read service asks one more, to learn
        whether another page follows). Raises BadCursor."""

    def due_runs(
        self, now: float, limit: int = 500, delivered: Delivered | None = None
    ) -> list[Run]:
        """Movable runs whose lease expired, or whose next message is overdue
        and, if ``delivered`` is given, no longer possibly queued."""

    def ping(self) -> None:
        """Reach the database and back, reading no table (a health check):
        :class:`~harness.errors.StoreError` if it does not answer."""

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


class RunNotes(Protocol):
    """Writes beside the version: an operator's note or a late charge that
    must not fence a step in flight (harness.engine.operations, billing)."""

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


class ToolRecords(Protocol):
    """The durable idempotency records of tool calls (harness.engine.executor,
    a fork's copies): first writer wins."""

    def get_tool_result(self, key: str) -> tuple[bool, JSON]:
        """(found, result) of the durable idempotency record."""

    def put_tool_result(
        self, key: str, run_id: str, step_index: int, tool: str, result: JSON, now: float
    ) -> JSON:
        """Store a result unless one exists; return whichever is stored."""

    def tool_records(self, keys: Sequence[str]) -> list[ToolRecord]:
        """The durable idempotency records under ``keys`` (those that exist), by
        step index: what a fork copies under its own keys."""


class OfferedTools(Protocol):
    """The tools each run was offered by its toolsets (harness.engine.offering):
    recorded once, first writer wins, never changed; deleted with the run."""

    def offered_tools(self, run_id: str) -> JSON | None:
        """The run's record, or None if none was made."""

    def offer_tools(self, run_id: str, tools: JSON, now: float) -> JSON:
        """Record ``tools`` for the run unless a record exists; return the stored one."""


class Lanes(Protocol):
    """The delivery probes' record, by lane (harness.engine.probes)."""

    def lanes(self) -> dict[str, Lane]:
        """The delivery probes' record, by lane (harness.engine.probes)."""

    def note_probe_sent(self, lane: str, at: float) -> None:
        """A probe was sent down ``lane`` at ``at``."""

    def note_delivered(self, lane: str, sent_at: float) -> None:
        """A worker took the probe sent at ``sent_at`` off ``lane``: raise the
        lane's ``delivered_before`` to it (never lower it)."""


class Sweeps(Protocol):
    """Sweeps recorded, and the lease of the worker that sweeps while beat
    does not (harness.engine.recovery, harness.celery.takeover)."""

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
        not (harness.celery.takeover), until ``until``: True if ``holder``
        holds it now, False if another does and it has not lapsed."""

    def release_sweep_lease(self, holder: str) -> None:
        """Give the lease up, if ``holder`` holds it."""


class Stats(Protocol):
    """Counts for ``harness stats`` and ``/metrics`` (harness.reads)."""

    def event_counts(self) -> dict[str, int]:
        """How many events of each kind were recorded (for stats)."""

    def run_counts(self) -> dict[str, int]:
        """How many runs are in each status."""

    def counters(self) -> dict[str, int]:
        """Durable counters of things that leave no row (stale writes rejected)."""

    def running_steps_started_before(self, cutoff: float) -> int:
        """How many steps are RUNNING since before ``cutoff`` (the stuck-step alert)."""

    def oldest_running_step_started_at(self) -> float | None:
        """When the oldest step RUNNING in a run still moving started; None if none."""


class Retention(Protocol):
    """What prune reads and deletes (harness.runs.prune)."""

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


class Archives(Protocol):
    """A run whole, as its tables hold it: export and import
    (harness.runs.archive), and a fork's insert (harness.runs.fork)."""

    def run_rows(self, run_id: str) -> RunRows:
        """The run as its tables hold it, read in one snapshot (a run moving
        meanwhile is seen before or after a checkpoint, never halfway).
        Raises RunNotFound."""

    def import_run(self, rows: RunRows) -> bool:
        """Insert a run with its steps, events (in order, new ids) and
        idempotency records in one transaction. False, writing nothing, if the
        run id is taken; any failure writes nothing (StoreError)."""

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


class Catalog(Protocol):
    """The agents live workers carry (harness.catalog)."""

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


class Waits(Protocol):
    """Runs waiting on the world (harness.engine.waits): answers to deferred
    steps, signals kept until a step asks, child runs, waits that are due."""

    def complete_deferred(self, completion: Completion) -> bool:
        """Give deferred step ``completion.index`` its answer, in one
        transaction, without moving the run's version: the step's status,
        result, error and end; the kept signal it takes (once: a signal taken
        already refuses the whole write); a child's usage added to the run's;
        a waiting run's ``wake_at`` set to now; the event at the run's
        current version. False, writing nothing, if the step is not deferred
        (answered already, or not deferred yet)."""

    def keep_signal(self, draft: SignalDraft) -> int | None:
        """Keep a signal for a run, and set its ``wake_at`` to now if it waits
        on deferred steps (so the sweeper gives it to its step if the sender
        dies first); its row id. None, writing nothing, if the run already
        kept one with this ``signal_id`` (a sender's retry)."""

    def kept_signals(self, run_id: str) -> list[KeptSignal]:
        """The run's signals no step has taken, oldest first."""

    def has_signal(self, run_id: str, signal_id: str) -> bool:
        """Did the run receive a signal with this sender's id (taken or not)?"""

    def children(self, run_id: str) -> list[Run]:
        """The runs started by the run's steps (their ``parent`` is it), by id."""

    def due_waits(self, now: float, limit: int = 500) -> list[Run]:
        """Runs waiting on deferred steps whose ``wake_at`` has passed: a
        timeout or a sleep is due, or an answer came that nobody acted on."""

    def wait_counts(self) -> dict[str, int]:
        """Deferred steps by what they wait for (``callback``, ``signal``,
        ``sleep``, ``child``), and ``signals_kept``: kept signals not taken."""

    def oldest_wait(self) -> OldestWait | None:
        """The deferred step, of a run waiting on its deferred steps, that
        started first; None if no run waits so."""

    def wait_events(self) -> dict[str, int]:
        """From the flight recorder: ``timeouts`` (deferred steps answered
        by their timeout, the event's detail ``timed out: ...``) and
        ``children_started`` (runs created as a child, ``...; child of ...``)."""


class Inbox(Protocol):
    """A user's messages to a run (harness.engine.conversation): kept as
    signals named :data:`MESSAGE` until a model turn takes them."""

    def keep_message(
        self, run_id: str, text: str, now: float, message_id: str | None = None
    ) -> int | None:
        """Keep ``text`` for the run's next model turn and mark the run's inbox
        (``inbox_at``, if unset) beside the version, in one transaction, the
        run's row locked first (so a :meth:`clear_inbox` under way finishes
        before, or sees the message); the message's row id. None, writing
        nothing, if the run already kept one with this ``message_id``."""

    def clear_inbox(self, run_id: str) -> None:
        """Unmark the run's inbox, beside the version, unless a message still
        waits in it (so one kept meanwhile is never hidden)."""

    def stranded_inboxes(self, before: float, limit: int = 500) -> list[str]:
        """Completed runs whose inbox was marked before ``before``: a message
        kept as the run completed, whose sender and finisher both died before
        either continued the run (the sweeper continues them)."""


class Streams(Protocol):
    """The pieces of model answers as they are written (harness.streams),
    where there is no Redis: a view for the API's event stream, not part of
    the record."""

    def append_stream(self, run_id: str, entries: Sequence[StreamEntry], now: float) -> None:
        """Append ``entries`` to the run's stream, in order, in one transaction."""

    def stream_after(
        self, run_id: str, after: int, limit: int = 1000
    ) -> list[tuple[int, StreamEntry]]:
        """The run's entries with an id above ``after``, oldest first, each
        with its id (ascending; ids are never reused)."""

    def trim_streams(self, before: float) -> int:
        """Forget the entries written before ``before``; how many."""


class Store(
    RunStore,
    RunNotes,
    ToolRecords,
    OfferedTools,
    Lanes,
    Sweeps,
    Stats,
    Retention,
    Archives,
    Catalog,
    Waits,
    Inbox,
    Streams,
    Protocol,
):
    """What the runner, the sweeper, the operators and the CLI need from
    durable storage: every part, as one backend provides it."""


class ReadStore(RunStore, Sweeps, Stats, Catalog, Waits, Streams, Protocol):
    """What the read side uses: runs, sweeps and counts (harness.reads), and
    the agent catalog (``harness agents``)."""
