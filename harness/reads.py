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

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass

from harness.engine.leases import Clock
from harness.errors import BadCursor
from harness.records import JSON, Event, Run, RunStatus, Step, StepStatus
from harness.store import Store

#: The most runs or events one page may hold.
MAX_PAGE = 1000
#: Events per page when a caller does not say.
HISTORY_PAGE = 500
#: Steps per page when a caller does not say.
STEPS_PAGE = 200


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

    def __post_init__(self) -> None:
        _check_limit(self.limit)


@dataclass(frozen=True)
class RunPage:
    """Runs newest first; ``next_cursor`` is None on the last page."""

    runs: list[Run]
    next_cursor: str | None


@dataclass(frozen=True)
class RunDetail:
    """A run and all its steps (``harness show``)."""

    run: Run
    steps: list[Step]

    def to_dict(self) -> dict[str, JSON]:
        """The JSON of ``harness show --json``: the run's fields and ``steps``."""
        return {**self.run.to_dict(), "steps": [s.to_dict() for s in self.steps]}


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
    ``next_start`` is None on the last page."""

    steps: list[Step]
    total: int
    next_start: int | None


def attention(run: Run, now: float, running_alert: float) -> str | None:
    """Why an operator should look at ``run`` (loaded with its current step),
    or None: ``paused``, ``in_doubt``, ``awaiting_approval``, ``stuck`` (its
    step RUNNING for longer than ``running_alert`` seconds) or ``blocked``."""
    if run.status.terminal:
        return None
    if run.status is RunStatus.PAUSED:
        return "paused"
    step = run.current
    if step is not None and step.status is StepStatus.IN_DOUBT:
        return "in_doubt"
    if step is not None and step.status is StepStatus.AWAITING_APPROVAL:
        return "awaiting_approval"
    if (
        step is not None
        and step.status is StepStatus.RUNNING
        and step.started_at is not None
        and now - step.started_at > running_alert
    ):
        return "stuck"
    if run.blocked:
        return "blocked"
    return None


def encode_cursor(run: Run) -> str:
    """The opaque cursor of the page after ``run``."""
    raw = json.dumps([run.created_at, run.run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


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


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise BadCursor(f"a page holds 1 to {MAX_PAGE} items, not {limit}")


class Reads:
    """The read side over a :class:`~harness.store.Store`.

    ``running_alert``: seconds after which a RUNNING step counts as stuck in
    :meth:`stats` (``HARNESS_RUNNING_ALERT``).
    """

    def __init__(self, store: Store, clock: Clock, running_alert: float) -> None:
        self.store = store
        self.clock = clock
        self.running_alert = running_alert

    def list_runs(self, query: RunQuery | None = None) -> RunPage:
        """One page of runs, newest first."""
        query = query or RunQuery()
        before = None if query.cursor is None else decode_cursor(query.cursor)
        # One more than asked: whether a next page exists, without counting.
        runs = self.store.query_runs(
            query.limit + 1,
            status=query.status,
            agent=query.agent,
            created_before=query.created_before,
            created_after=query.created_after,
            before=before,
            forked_from=query.forked_from,
            replay_of=query.replay_of,
        )
        if len(runs) <= query.limit:
            return RunPage(runs, None)
        runs = runs[: query.limit]
        return RunPage(runs, encode_cursor(runs[-1]))

    def run(self, run_id: str) -> Run:
        """The run with the step at its cursor. Raises RunNotFound."""
        return self.store.load(run_id)

    def steps(self, run_id: str) -> list[Step]:
        """Every step of a run, in order. Raises RunNotFound."""
        self.store.load(run_id)  # an unknown id is an error, not an empty list
        return self.store.steps(run_id)

    def attention(self, run: Run) -> str | None:
        """Why an operator should look at ``run`` now (:func:`attention`)."""
        return attention(run, self.clock.now(), self.running_alert)

    def steps_page(self, run_id: str, start: int = 0, limit: int = STEPS_PAGE) -> StepPage:
        """``limit`` steps from index ``start``: a long run's timeline a window
        at a time. Raises RunNotFound."""
        _check_limit(limit)
        if start < 0:
            raise BadCursor(f"a step index is 0 or more, not {start}")
        run = self.store.load(run_id)
        steps = self.store.steps(run_id, start, limit)
        end = start + len(steps)
        return StepPage(steps, run.step_count, end if end < run.step_count else None)

    def run_detail(self, run_id: str) -> RunDetail:
        """The run and its steps. Raises RunNotFound."""
        return RunDetail(self.store.load(run_id), self.store.steps(run_id))

    def history(
        self, run_id: str, after_id: int | None = None, limit: int = HISTORY_PAGE
    ) -> EventPage:
        """The run's flight recorder from the event after ``after_id``, oldest
        first, one page. Raises RunNotFound."""
        _check_limit(limit)
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
        return {
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
                self.clock.now() - self.running_alert
            ),
            "running_alert_seconds": self.running_alert,
            "runs_by_status": self.store.run_counts(),
        }
