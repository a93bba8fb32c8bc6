"""The read service: what the CLI shows, and the HTTP API will serve.

Everything here reads the store and nothing else: no agent code is imported,
so an operator can inspect runs from a machine, or with a ``HARNESS_IMPORTS``,
where the agents cannot be imported.

Lists are paginated by keyset, not by offset: a page of runs ends with an
opaque cursor naming the last run's (created_at, run_id), and the next page
starts strictly after it, so runs created meanwhile neither shift nor repeat
rows. A run's history pages on event ids, which only grow: "the events after
id N" is also how a client follows a live run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.clock import Clock
from harness.engine import transitions
from harness.errors import BadCursor, RunNotFound
from harness.output import may_be_structured, shown_result
from harness.records import JSON, Event, Run, RunStatus, Step, StepStatus, WaitKind
from harness.settings import DEFAULT_SWEEP_INTERVAL
from harness.store import (
    MAX_PAGE,
    SCHEDULED_SWEEPS,
    ReadStore,
    RunQuery,
    Sweep,
    check_limit,
    decode_cursor,
    encode_cursor,
)

__all__ = [
    "ATTENTION",
    "HISTORY_PAGE",
    "MAX_PAGE",
    "STEPS_PAGE",
    "Attention",
    "EventPage",
    "Reads",
    "RunDetail",
    "RunPage",
    "RunQuery",
    "StepPage",
    "abandoned",
    "attention",
    "attention_fields",
    "child_dict",
    "decode_cursor",
    "encode_cursor",
    "fell_due",
    "needs",
    "step_dict",
    "waits_for",
]

#: Events per page when a caller does not say.
HISTORY_PAGE = 500
#: Steps per page when a caller does not say.
STEPS_PAGE = 200


@dataclass(frozen=True)
class RunPage:
    """Runs newest first; ``next_cursor`` is None on the last page."""

    runs: list[Run]
    next_cursor: str | None


@dataclass(frozen=True)
class Attention:
    """Why an operator should look at a run: ``code``, one of
    :data:`ATTENTION`, which the dashboard keys on, and ``detail``, a
    sentence that says what is wrong and what to do."""

    code: str
    detail: str


#: The codes of :class:`Attention`, most pressing first.
ATTENTION = (
    "paused",
    "in_doubt",
    "awaiting_approval",
    "child_waiting",
    "unswept",
    "stuck",
    "blocked",
)
#: What a child run's attention makes its parent's (``child_waiting``): a
#: child held for an operator, or one of its own children so held.
FOR_AN_OPERATOR = frozenset({"in_doubt", "awaiting_approval", "child_waiting"})
#: How far down a chain of children the reads look for one held for an operator.
MAX_CHILD_DEPTH = 8


def attention_fields(found: Attention | None) -> dict[str, JSON]:
    """``attention`` (the code) and ``attention_detail`` of a run's JSON."""
    if found is None:
        return {"attention": None, "attention_detail": None}
    return {"attention": found.code, "attention_detail": found.detail}


def abandoned(step: Step, run: Run) -> bool:
    """A step left RUNNING in a run that has ended (cancelled mid-step, or
    failed): it will never finish, though its row still says ``running``,
    the last thing recorded of it."""
    return run.status.terminal and step.status is StepStatus.RUNNING


def step_dict(step: Step, run: Run) -> dict[str, JSON]:
    """A step's JSON as the reads serve it: the stored fields, ``abandoned``,
    and, for a deferred call, ``waits_for`` (:func:`waits_for`)."""
    shown = {**step.to_dict(), "abandoned": abandoned(step, run)}
    said = waits_for(step)
    if said is not None:
        shown["waits_for"] = said
    return shown


def waits_for(step: Step) -> str | None:
    """What a deferred call waits for, and until when, for a person:
    ``signal 'paid' until 2026-05-01T10:00:00Z``, ``child run r1:1``,
    ``a sleep until ...``; None for a step that does not wait."""
    if step.status is not StepStatus.DEFERRED:
        return None
    wait = step.wait
    if wait is None:
        return "an answer"
    said = wait.describe()
    if wait.until is not None:
        said += f" until {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(wait.until))}"
    return said


@dataclass(frozen=True)
class RunDetail:
    """A run and all its steps (``harness show``), and why an operator should look."""

    run: Run
    steps: list[Step]
    attention: Attention | None = None
    #: The runs its steps started (``harness.agent_tool``), by id.
    children: list[Run] = field(default_factory=list)

    def to_dict(self) -> dict[str, JSON]:
        """The JSON of ``harness show --json``: the run's fields (``parent``
        among them), its ``attention`` and ``attention_detail``, its
        ``children`` (``{"run_id", "step", "status"}``) and ``steps``; its
        ``result`` a JSON object if it is a structured answer (harness.output)."""
        run, steps = self.run, self.steps
        final = steps[run.cursor - 1] if 0 < run.cursor <= len(steps) else None
        return {
            **run.to_dict(),
            "result": shown_result(run, final),
            **attention_fields(self.attention),
            "children": [child_dict(c) for c in self.children],
            "steps": [step_dict(s, self.run) for s in self.steps],
        }


def child_dict(child: Run) -> dict[str, JSON]:
    """A child run as its parent lists it: its id, the parent's step that
    started it, and its status."""
    step = None if child.parent is None else child.parent.step
    return {"run_id": child.run_id, "step": step, "status": child.status.value}


@dataclass(frozen=True)
class EventPage:
    """Events oldest first. ``next_after``: the ``after_id`` of the next page,
    None when this one reached the end of the recorder (so far: a live run
    records more, after ``events[-1].id``)."""

    events: list[Event]
    next_after: int | None


@dataclass(frozen=True)
class StepPage:
    """Steps in index order from ``start``. ``total``: the run's step count;
    ``next_start`` is None on the last page. ``run``: the run, as read with them."""

    steps: list[Step]
    total: int
    next_start: int | None
    run: Run | None = None

    def to_dict(self) -> dict[str, JSON]:
        """``{"steps", "total", "next_start"}``, each step with ``abandoned``."""
        steps = [s.to_dict() if self.run is None else step_dict(s, self.run) for s in self.steps]
        return {"steps": steps, "total": self.total, "next_start": self.next_start}


def attention(run: Run, now: float, running_alert: float, unswept: bool = False) -> str | None:
    """The code of :func:`needs`, or None."""
    found = needs(run, now, running_alert, unswept)
    return None if found is None else found.code


def needs(
    run: Run,
    now: float,
    running_alert: float,
    unswept: bool = False,
    waiting_child: Attention | None = None,
) -> Attention | None:
    """Why an operator should look at ``run`` (loaded with its current step),
    or None: ``paused``, ``in_doubt``, ``awaiting_approval``,
    ``child_waiting`` (``waiting_child``: a child run held for an operator,
    found by the caller), ``unswept`` (``unswept``: it fell to the sweeper,
    :func:`fell_due`, and no sweep has run since), ``stuck`` (its step
    RUNNING for longer than ``running_alert`` seconds) or ``blocked``.

    A run waiting on its deferred calls (a callback, a signal, a sleep, a
    child still working) is not an operator's to look at: the world, or its
    timeout, moves it on."""
    if run.status.terminal:
        return None
    if run.status is RunStatus.PAUSED:
        return Attention("paused", "paused at a step boundary: `harness resume` sets it moving")
    step = run.current
    if step is not None and step.status is StepStatus.IN_DOUBT:
        return Attention(
            "in_doubt",
            f"step {step.index} may have run before its worker died: `harness resolve` settles it",
        )
    if step is not None and step.status is StepStatus.AWAITING_APPROVAL:
        return Attention(
            "awaiting_approval",
            f"step {step.index} ({step.tool}) waits for `harness approve` or `harness reject`",
        )
    if waiting_child is not None:
        return waiting_child
    due = fell_due(run)
    if unswept and due is not None:
        return Attention("unswept", _unswept(run, max(0.0, now - due)))
    if (
        step is not None
        and step.status is StepStatus.RUNNING
        and step.started_at is not None
        and now - step.started_at > running_alert
    ):
        return Attention(
            "stuck",
            f"step {step.index} running for {now - step.started_at:.0f}s, "
            f"longer than {running_alert:g}s",
        )
    if run.blocked:
        return Attention("blocked", run.blocked)
    return None


def fell_due(run: Run) -> float | None:
    """When ``run`` fell to the sweeper, its one way on: the expiry of its
    worker's lease, or the wake-up of a run the sweeper must wake (owner a
    mark: re-sent, backed off, rescheduled). None while the run is not
    movable, or unleased (its step message may just be queued)."""
    if not run.status.movable or run.owner is None:
        return None
    if run.owner in transitions.MARKS:
        return run.wake_at
    return run.lease_expires_at


def _unswept(run: Run, ago: float) -> str:
    what = "wake-up was" if run.owner in transitions.MARKS else "lease expired"
    return (
        f"{what} {ago:.0f}s ago and no sweep has run since: "
        "is `celery beat` running? (`harness sweep` recovers it now)"
    )


class Reads:
    """The read side over a store (the part :class:`~harness.store.ReadStore` names).

    ``running_alert``: seconds after which a RUNNING step counts as stuck in
    :meth:`stats` (``HARNESS_RUNNING_ALERT``). ``sweep_interval``: the
    sweeper's period (``HARNESS_SWEEP_INTERVAL``); a run that fell to the
    sweeper longer ago than that, with no sweep since, is ``unswept``.
    """

    def __init__(
        self,
        store: ReadStore,
        clock: Clock,
        running_alert: float,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    ) -> None:
        self.store = store
        self.clock = clock
        self.running_alert = running_alert
        self.sweep_interval = sweep_interval

    def list_runs(self, query: RunQuery | None = None) -> RunPage:
        """One page of runs, newest first."""
        query = query or RunQuery()
        # One more than asked: whether a next page exists, without counting.
        runs = self.store.query_runs(query, query.limit + 1)
        if len(runs) <= query.limit:
            return RunPage(runs, None)
        runs = runs[: query.limit]
        return RunPage(runs, encode_cursor(runs[-1]))

    def run(self, run_id: str) -> Run:
        """The run with the step at its cursor. Raises RunNotFound."""
        return self.store.load(run_id)

    def children(self, run_id: str) -> list[Run]:
        """The runs the run's steps started, by id (none for most runs)."""
        return self.store.children(run_id)

    def steps(self, run_id: str) -> list[Step]:
        """Every step of a run, in order. Raises RunNotFound."""
        self.store.load(run_id)  # an unknown id is an error, not an empty list
        return self.store.steps(run_id)

    def attention(self, run: Run) -> str | None:
        """Why an operator should look at ``run`` now (:func:`attention`)."""
        found = self.needs(run)
        return None if found is None else found.code

    def needs(self, run: Run) -> Attention | None:
        """Why an operator should look at ``run`` now, and what to do (:func:`needs`)."""
        return self._needs(run, self.clock.now(), MAX_CHILD_DEPTH)

    def _needs(self, run: Run, now: float, depth: int) -> Attention | None:
        child = self._waiting_child(run, now, depth)
        return needs(run, now, self.running_alert, self._unswept(run, now), child)

    def _waiting_child(self, run: Run, now: float, depth: int) -> Attention | None:
        """``child_waiting`` if a child of ``run`` is held for an operator (its
        call's approval, a call in doubt, or such a child of its own). The
        store is asked only for a run with deferred calls, and each child
        waiting loaded with its step."""
        if depth <= 0 or run.deferred_from is None or run.status.terminal:
            return None
        for listed in self.store.children(run.run_id):
            if listed.status is not RunStatus.WAITING:
                continue
            try:
                child = self.store.load(listed.run_id)
            except RunNotFound:  # it ended and was pruned since it was listed
                continue
            found = self._needs(child, now, depth - 1)
            if found is not None and found.code in FOR_AN_OPERATOR:
                return Attention("child_waiting", f"child run {child.run_id}: {found.detail}")
        return None

    def _unswept(self, run: Run, now: float) -> bool:
        """Has ``run`` waited for a sweep longer than a sweep interval, and
        none run since it fell due? The store is asked only for such a run."""
        due = fell_due(run)
        if due is None or now - due <= self.sweep_interval:
            return False
        last = self.store.last_sweep()
        return last is None or last.started_at < due

    def listed(self, run: Run) -> dict[str, JSON]:
        """A run's JSON in a listing: its fields, ``attention`` and ``attention_detail``."""
        return {**run.to_dict(), "result": self.result(run), **attention_fields(self.needs(run))}

    def result(self, run: Run) -> JSON:
        """The run's ``result`` as shown: the JSON object of a structured
        answer, else its text. The store is asked for the final step only
        for a completed run whose result could be one (its text an object)."""
        if not may_be_structured(run):
            return run.result
        try:
            final = self.store.steps(run.run_id, run.cursor - 1, 1)
        except RunNotFound:  # pruned since it was read
            return run.result
        return shown_result(run, final[0] if final else None)

    def steps_page(self, run_id: str, start: int = 0, limit: int = STEPS_PAGE) -> StepPage:
        """``limit`` steps from index ``start``: a long run's timeline a window
        at a time. Raises RunNotFound."""
        check_limit(limit)
        if start < 0:
            raise BadCursor(f"a step index is 0 or more, not {start}")
        run = self.store.load(run_id)
        steps = self.store.steps(run_id, start, limit)
        end = start + len(steps)
        return StepPage(steps, run.step_count, end if end < run.step_count else None, run)

    def run_detail(self, run_id: str) -> RunDetail:
        """The run, its steps, and its attention. Raises RunNotFound."""
        run = self.store.load(run_id)
        steps = self.store.steps(run_id)
        return RunDetail(run, steps, self.needs(run), self.store.children(run_id))

    def history(
        self, run_id: str, after_id: int | None = None, limit: int = HISTORY_PAGE
    ) -> EventPage:
        """The run's flight recorder from the event after ``after_id``, oldest
        first, one page. Raises RunNotFound."""
        check_limit(limit)
        events = self.store.events_after(run_id, after_id, limit + 1)
        if not events:
            self.store.load(run_id)  # every run records its creation: maybe no such run
            return EventPage([], None)
        if len(events) <= limit:
            return EventPage(events, None)
        events = events[:limit]
        return EventPage(events, events[-1].id)

    def all_history(self, run_id: str, after_id: int | None = None) -> Iterator[Event]:
        """Every event after ``after_id``, page by page. Raises RunNotFound."""
        while True:
            page = self.history(run_id, after_id)
            yield from page.events
            if page.next_after is None:
                return
            after_id = page.next_after

    def stats(self) -> dict[str, JSON]:
        """Recovery metrics, counted durably in the store (``harness stats``)."""
        events = self.store.event_counts()
        now = self.clock.now()
        last = self.store.last_sweep()
        beat = self.store.last_sweep(SCHEDULED_SWEEPS)
        return {
            # Seconds since the last sweep began, whoever ran it; null: none recorded.
            "last_sweep_age_s": _age(last, now),
            "last_sweep_kind": None if last is None else last.kind.value,
            # Since beat's (or a tasks.sweep message's): while it grows, a worker sweeps.
            "beat_sweep_age_s": _age(beat, now),
            "sweep_interval_seconds": self.sweep_interval,
            "recovered_running_steps": events.get("recovered_running", 0),
            "stale_writes_rejected": self.store.counters().get("stale_writes", 0),
            "lease_takeovers": events.get("lease_takeover", 0),
            "in_doubt_steps": events.get("in_doubt", 0),
            "sweeper_redispatches": events.get("redispatched", 0),
            # Claims that gave way to a busy idempotency key: not attempts, not crashes.
            "back_offs": events.get("backed_off", 0),
            # Times a worker recorded why it could not carry a run (`show` has the reason).
            "runs_blocked": events.get("blocked", 0),
            # Transient provider failures retried later, and waits for a shared rate limit.
            "model_retries": events.get("retry_scheduled", 0),
            "rate_limit_waits": events.get("rate_limited", 0),
            "running_steps_older_than_alert": self.store.running_steps_started_before(
                now - self.running_alert
            ),
            "running_alert_seconds": self.running_alert,
            "runs_by_status": self.store.run_counts(),
            **self._wait_stats(now),
        }

    def _wait_stats(self, now: float) -> dict[str, JSON]:
        """What waits on the world: deferred calls by what they wait for,
        signals kept, timeouts and children started, and the oldest wait."""
        counts = self.store.wait_counts()
        kept = counts.pop("signals_kept", 0)
        oldest = self.store.oldest_wait()
        events = self.store.wait_events()
        return {
            "deferred_steps": {kind.value: counts.get(kind.value, 0) for kind in WaitKind},
            "signals_kept": kept,
            "wait_timeouts": events.get("timeouts", 0),
            "children_started": events.get("children_started", 0),
            # Seconds the oldest deferred call of a waiting run has waited; null: none waits.
            "oldest_wait_s": None if oldest is None else round(max(0.0, now - oldest.since), 3),
            "oldest_wait_run": None if oldest is None else oldest.run_id,
        }


def _age(sweep: Sweep | None, now: float) -> float | None:
    return None if sweep is None else round(max(0.0, now - sweep.started_at), 3)
