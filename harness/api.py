"""The public API: what ``import harness`` offers, thin over the services.

Each function checks what comes in from outside (harness.inputs), then asks
the operations service (harness.engine.operations), the create rule
(harness.engine.creation: one rule for every door, the same id with another
agent or goal is a :class:`~harness.errors.RunConflict`) or the read service
(harness.reads), on this process's runtime. The runtime and the settings are
built once per process by the composition root (harness.compose); the names
of its hooks are re-exported here, where the Celery layer and the tests have
found them.
"""

from __future__ import annotations

import getpass
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from harness import callbacks, catalog, compose
from harness.agents import get_agent
from harness.compose import STEP_CONNECTIONS as STEP_CONNECTIONS
from harness.compose import ensure_agents as ensure_agents
from harness.compose import open_store as open_store
from harness.compose import reads as reads
from harness.compose import runtime as runtime
from harness.compose import use_sender as use_sender
from harness.compose import use_step_threads as use_step_threads
from harness.compose import use_store as use_store
from harness.engine import conversation, creation, operations, waits
from harness.engine.conversation import Sent
from harness.engine.operations import Acted
from harness.engine.transitions import OPERATOR
from harness.engine.waits import Delivered
from harness.errors import BadInput, RunNotFound
from harness.inputs import MAX_GOAL, checked_json, checked_text
from harness.records import JSON, Run, RunStatus, Step
from harness.replay import report, rerun
from harness.replay.report import ReplayReport
from harness.runs import fork as forks
from harness.waiting import refuse_marker, signal_name

if TYPE_CHECKING:
    from harness.runs import archive
    from harness.streams.feed import Event

log = logging.getLogger(__name__)


def reset_runtime() -> None:
    """Forget this process's runtime and settings (tests; after the environment changed)."""
    compose.reset()


#: The longest run id, agent name and operator name: their columns' lengths.
MAX_RUN_ID = 128
MAX_NAME = 200
#: The largest token budget: the column is a 32-bit integer.
MAX_TOKENS = 2**31 - 1


class Started(NamedTuple):
    """What :func:`start` did: the run's id, and False if that run existed."""

    run_id: str
    created: bool


def start(agent_name: str, goal: str, run_id: str | None = None) -> Started:
    """:func:`start_run`, saying whether the run was created (False: the same
    run, this agent and goal, existed under ``run_id``). Raises BadInput,
    AgentNotFound, RunConflict (``run_id`` holds another run)."""
    _names(goal, agent_name, run_id)
    rt = runtime()
    ensure_agents()
    run, created = creation.create(rt, agent_name, goal, run_id)
    return Started(run.run_id, created)


def start_run(agent_name: str, goal: str, run_id: str | None = None) -> str:
    """Create a run and dispatch its first step; its id. Idempotent on an
    explicit ``run_id``: the same agent and goal again is a no-op, another
    agent or goal a :class:`~harness.errors.RunConflict`."""
    return start(agent_name, goal, run_id).run_id


def list_agents() -> list[catalog.CatalogEntry]:
    """The agents live workers carry, by name (``harness agents``). Imports
    no agent code: the workers published them (harness.catalog)."""
    rt = runtime()
    return catalog.live_agents(rt.store, rt.clock.now())


def get_run(run_id: str) -> Run:
    """The run with the step at its cursor. Raises :class:`RunNotFound`."""
    return runtime().store.load(run_id)


def get_steps(run_id: str) -> list[Step]:
    """Every step of the run, in order. Raises :class:`RunNotFound`."""
    return reads().steps(run_id)


def cancel_run(run_id: str, reason: str = "cancelled by operator") -> Run:
    """Stop a run. A step executing now finishes, but its result is not recorded.
    Raises DecisionConflict if the run ended otherwise first."""
    return Operator().cancel(run_id, reason).run


def resolve_run(run_id: str, decision: str, result: JSON = None, force: bool = False) -> Run:
    """Settle a run's in-doubt step: ``retry``, ``succeeded`` (with its result) or ``fail``."""
    return Operator().resolve(run_id, decision, result, force).run


def approve(
    run_id: str,
    step: int | None = None,
    args: dict[str, JSON] | None = None,
    by: str | None = None,
) -> Run:
    """Approve the call the run waits on (or, with ``step``, a later call of its
    batch), with ``args`` to call it with instead of the proposed ones. Acted
    on once: the same approval again is a no-op; a call approved otherwise or
    rejected keeps that word (DecisionConflict)."""
    return Operator(by).approve(run_id, step, args).run


def reject(run_id: str, reason: str, step: int | None = None, by: str | None = None) -> Run:
    """Reject the call the run waits on (or a later call of its batch): it is
    not made, and the model is told ``reason``. The same rejection again is a
    no-op; a call decided otherwise keeps that word (DecisionConflict)."""
    return Operator(by).reject(run_id, reason, step).run


def complete_step(
    run_id: str,
    step: int | None = None,
    *,
    result: JSON = None,
    error: str | None = None,
    by: str | None = None,
) -> Delivered:
    """Answer a deferred call (``step``; None: the run's oldest deferred step)
    with ``result``, or ``error`` (a failed call the model is told of). Once:
    an answer to a step answered already changes nothing (``changed`` False);
    one to a call still under way is kept until it defers."""
    return Operator(by).complete(run_id, step, result=result, error=error)


def signal(run_id: str, name: str, data: JSON = None, *, signal_id: str | None = None) -> Delivered:
    """Send signal ``name`` with ``data`` to a run: the oldest step deferred on
    that name takes it, or it is kept (in the store) until one asks.
    ``signal_id``: a retry with the same id is received once."""
    return Operator().signal(run_id, name, data, signal_id)


def answer_callback(token: str, body: JSON = None) -> Delivered:
    """A POST to a deferred call's callback URL (``ctx.callback_url()``,
    ``POST /api/callbacks/{token}``): the token is verified first (BadToken,
    ExpiredToken, or ConfigError without HARNESS_CALLBACK_SECRET), then
    ``body`` is the call's result, checked as every door checks JSON; an
    object whose one key is ``"error"``, holding text, makes it an error
    result instead. A repeat of the same URL changes nothing (``changed``
    False)."""
    rt = runtime()
    callbacks.verify(rt.callback_secret, token, rt.clock.now())  # before the body is looked at
    result, error = callback_answer(body)
    return waits.callback(rt, token, result, error)


def callback_answer(body: JSON) -> tuple[JSON, str | None]:
    """A callback's body as the call's answer: ``(result, None)``, or
    ``(None, error)`` for ``{"error": "..."}``. BadInput if it cannot be stored."""
    if isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str):
        return None, _error_text(body["error"])
    return checked_json(body, "body"), None


def pause_run(run_id: str, by: str | None = None) -> Run:
    """Hold the run at its next step boundary until :func:`resume_run`."""
    return Operator(by).pause(run_id).run


def resume_run(
    run_id: str,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
    by: str | None = None,
    max_steps: int | None = None,
) -> Run:
    """Set a paused run moving, with its budgets (and step limit) raised if given."""
    return Operator(by).resume(run_id, max_tokens, max_cost_usd, max_steps).run


def send_message(run_id: str, text: str, *, message_id: str | None = None) -> Sent:
    """Give the run the user's next message: a completed run goes on with it
    (a step of kind ``user``, then a model turn); a moving one gets it at its
    next model turn (its final answer, if it is giving one, is steered on);
    a failed or cancelled one refuses it (DecisionConflict). ``message_id``:
    a sender's retry with the same id is received once."""
    return Operator().send(run_id, text, message_id)


def follow(run_id: str, after: str | None = None) -> Iterator[Event]:
    """The run's events as they happen, until it ends: its answers as they
    are written (``token``, ``discard``), its transitions (``step``), its end
    (``end``), each with an ``id``; ``after``: an id given before, to resume
    after it (harness.streams.feed). Raises RunNotFound, BadInput."""
    from harness.streams.feed import Cursor, follow_blocking

    cursor = Cursor.parse(after, "after")
    return follow_blocking(reads().store, compose.settings().redis_url, _run_id(run_id), cursor)


class Operator:
    """The operator's actions as every door takes them (Python, the CLI, HTTP):
    what an operator sends is checked here, once (harness.inputs: text a
    column can hold, JSON within its limits), and each action answers what
    it did (:class:`~harness.engine.operations.Acted`), or raises
    DecisionConflict when the run had already gone another way. ``by``: who
    acts, for the flight recorder (default: this process's user name)."""

    def __init__(self, by: str | None = None) -> None:
        self.by = _operator(None if by is None else checked_text(by, "by", MAX_NAME))

    def cancel(self, run_id: str, reason: str = "cancelled by operator") -> Acted:
        """:func:`cancel_run`."""
        checked_text(reason, "reason")
        return operations.cancel(runtime(), _run_id(run_id), reason)

    def resolve(
        self, run_id: str, decision: str, result: JSON = None, force: bool = False
    ) -> Acted:
        """:func:`resolve_run`."""
        try:
            chosen = operations.Decision(decision)
        except ValueError:
            ways = ", ".join(d.value for d in operations.Decision)
            raise BadInput("decision", f"is {decision!r}, not one of {ways}") from None
        result = checked_json(result, "result")
        rt = runtime()
        if chosen is operations.Decision.FAIL:
            ensure_agents()  # the agent's on_tool_error says whether the run fails too
        return operations.resolve(rt, _run_id(run_id), chosen, result, force)

    def approve(
        self, run_id: str, step: int | None = None, args: dict[str, JSON] | None = None
    ) -> Acted:
        """:func:`approve`."""
        if args is not None:
            if not isinstance(args, dict):
                raise BadInput("args", f"must be a JSON object, not {type(args).__name__}")
            args = checked_json(args, "args")
        ensure_agents()  # to check edited arguments against the tool
        return operations.decide(
            runtime(), _run_id(run_id), approve=True, who=self.by, step_index=step, args=args
        )

    def reject(self, run_id: str, reason: str, step: int | None = None) -> Acted:
        """:func:`reject`."""
        checked_text(reason, "reason")
        ensure_agents()  # to refuse a word on a call that does not need one
        return operations.decide(
            runtime(), _run_id(run_id), approve=False, who=self.by, step_index=step, reason=reason
        )

    def complete(
        self,
        run_id: str,
        step: int | None = None,
        *,
        result: JSON = None,
        error: str | None = None,
    ) -> Delivered:
        """:func:`complete_step`."""
        if step is not None and (isinstance(step, bool) or not 0 <= step <= MAX_TOKENS):
            raise BadInput("step", f"must be a step index, not {step!r}")
        if error is not None:
            if result is not None:
                raise BadInput("result", "give a result or an error, not both")
            _error_text(error)
        result = refuse_marker(checked_json(result, "result"), "result")
        by = f"completed by {self.by}"
        return waits.complete(runtime(), _run_id(run_id), step, result=result, error=error, by=by)

    def signal(
        self, run_id: str, name: str, data: JSON = None, signal_id: str | None = None
    ) -> Delivered:
        """:func:`signal`."""
        signal_name(name, "name")
        if signal_id is not None:
            checked_text(signal_id, "signal_id", MAX_NAME)
        data = refuse_marker(checked_json(data, "data"), "data")
        return waits.signal(runtime(), _run_id(run_id), name, data, signal_id)

    def pause(self, run_id: str) -> Acted:
        """:func:`pause_run`."""
        return operations.pause(runtime(), _run_id(run_id), self.by)

    def send(self, run_id: str, text: str, message_id: str | None = None) -> Sent:
        """:func:`send_message`."""
        if not isinstance(text, str) or not text.strip():
            raise BadInput("text", "must be a message: some text")
        checked_text(text, "text", MAX_GOAL)
        if message_id is not None:
            checked_text(message_id, "message_id", MAX_NAME)
        ensure_agents()  # an agent may refuse messages (a Pydantic AI agent's run)
        return conversation.send_message(runtime(), _run_id(run_id), text, message_id or None)

    def resume(
        self,
        run_id: str,
        max_tokens: int | None = None,
        max_cost_usd: float | None = None,
        max_steps: int | None = None,
    ) -> Acted:
        """:func:`resume_run`."""
        if max_steps is not None and not 1 <= max_steps <= MAX_TOKENS:
            raise BadInput("max_steps", f"must be from 1 to {MAX_TOKENS}, not {max_steps}")
        if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
            raise BadInput("max_tokens", f"must be from 1 to {MAX_TOKENS}, not {max_tokens}")
        if max_cost_usd is not None and not (math.isfinite(max_cost_usd) and max_cost_usd > 0):
            raise BadInput("max_cost_usd", f"must be a positive number, not {max_cost_usd}")
        return operations.resume(
            runtime(), _run_id(run_id), self.by, max_tokens, max_cost_usd, max_steps
        )


def _error_text(error: str) -> str:
    """A failed call's error, as the model will be told it: some text."""
    if not error.strip():
        raise BadInput("error", "must say what went wrong (it is empty)")
    return checked_text(error, "error")


def _run_id(run_id: str) -> str:
    return checked_text(run_id, "run_id", MAX_RUN_ID)


def _names(
    goal: str | None = None, agent: str | None = None, new_run_id: str | None = None
) -> None:
    """A new run's goal, agent and id, if given, as their columns can hold them."""
    if goal is not None:
        checked_text(goal, "goal", MAX_GOAL)
    if agent is not None:
        checked_text(agent, "agent", MAX_NAME)
    if new_run_id is not None:
        checked_text(new_run_id, "run_id", MAX_RUN_ID)


def _operator(who: str | None) -> str:
    if who:
        return who
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        return OPERATOR


def stats() -> dict[str, JSON]:
    """Recovery metrics, counted durably in the store (``harness stats``)."""
    return reads().stats()


def wait_for(run_id: str, timeout: float, poll: float = 0.2) -> Run:
    """Poll until the run ends or is held for an operator (waiting on one,
    paused), or ``timeout`` passes. A run waiting on its deferred calls (a
    callback, a signal, a sleep, a child) is waited for: the world moves it."""
    (run,) = wait_all([run_id], timeout, poll)
    return run


def fork_run(
    run_id: str,
    at: int,
    *,
    goal: str | None = None,
    agent: str | None = None,
    new_run_id: str | None = None,
) -> str:
    """A new run that reuses ``run_id``'s recorded steps before model step ``at``
    (copied, never executed again) and continues live from it, with another
    ``goal`` or ``agent`` if given; dispatched at once. Idempotent on an
    explicit ``new_run_id``. Raises BadForkPoint (saying where a fork can
    start), RunNotFound, AgentNotFound, RunConflict (``new_run_id`` holds
    another run), BadInput."""
    _names(goal=goal, agent=agent, new_run_id=new_run_id)
    rt = runtime()
    ensure_agents()
    return forks.fork_run(rt, run_id, at, goal=goal, agent=agent, new_run_id=new_run_id)


def export_run(run_id: str) -> dict[str, JSON]:
    """The run with its steps, flight recorder and tool records as one
    versioned, hashed document (harness.runs.archive). Raises RunNotFound."""
    from harness.runs import archive  # its document models (pydantic, the schema) load here

    return archive.export_run(runtime().store, run_id)


def import_run(document: str | bytes | dict[str, JSON]) -> archive.ImportResult:
    """Write an exported run into this store, in one transaction; idempotent.
    Raises BadArchive (nothing written) or ImportConflict (the id is taken by
    a run with other content)."""
    from harness.runs import archive  # its document models (pydantic, the schema) load here

    return archive.import_run(runtime().store, document)


def replay_run(
    run_id: str, agent: str, *, live_read_only: bool = False, new_run_id: str | None = None
) -> str:
    """A new run of ``agent`` on ``run_id``'s goal whose tool calls are served
    from ``run_id``'s recording (harness.replay); dispatched at once.
    Idempotent on an explicit ``new_run_id``. Raises RunNotFound,
    NotReplayable (the run has not ended), AgentNotFound, RunConflict
    (``new_run_id`` holds another run), BadInput."""
    _names(agent=agent, new_run_id=new_run_id)
    rt = runtime()
    ensure_agents()
    return rerun.replay_run(rt, run_id, agent, live_read_only=live_read_only, new_run_id=new_run_id)


def replay_batch(
    agent: str,
    *,
    from_agent: str | None = None,
    status: RunStatus | None = RunStatus.COMPLETED,
    since: float | None = None,
    limit: int = 20,
    live_read_only: bool = False,
) -> list[str]:
    """Replay the newest ended runs that match (never replays themselves)
    under ``agent``; the replays' ids, in the order of their recordings."""
    rt = runtime()
    ensure_agents()
    get_agent(agent)  # before choosing runs: an unknown agent is an error, not 0 replays
    chosen = rerun.recordings(rt.store, agent=from_agent, status=status, since=since, limit=limit)
    made = []
    for recording in chosen:
        try:
            made.append(
                rerun.replay_run(rt, recording.run_id, agent, live_read_only=live_read_only)
            )
        except RunNotFound:  # pruned since it was chosen: the others go on
            log.warning("run %s was deleted before its replay: skipped", recording.run_id)
    return made


def wait_all(run_ids: Sequence[str], timeout: float, poll: float = 0.2) -> list[Run]:
    """The runs once each has ended or is held for an operator (waiting on
    one, paused), or as they are when ``timeout`` passes (in the order given)."""
    deadline = time.monotonic() + timeout
    settled: dict[str, Run] = {}
    while True:
        for run_id in run_ids:
            if run_id not in settled:
                run = get_run(run_id)
                if run.status.terminal or (run.status.held and not run.waits_on_calls):
                    settled[run_id] = run
        if len(settled) == len(run_ids) or time.monotonic() >= deadline:
            return [settled.get(r) or get_run(r) for r in run_ids]
        time.sleep(poll)


def replay_report(replay_id: str) -> ReplayReport:
    """The replay ``replay_id`` against its recording, as it stands now.
    Raises RunNotFound, or OperatorError if it is no replay or its recording
    was deleted."""
    return report.report(runtime().store, replay_id)
