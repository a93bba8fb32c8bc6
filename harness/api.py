"""The public API and the per-process runtime behind it.

The runtime (settings, store, cache, worker id) is built on first use in
each process, so a Celery prefork child never shares a database connection
with its parent. Building it imports no agent code: the ``HARNESS_IMPORTS``
modules are imported by :func:`ensure_agents`, only where an agent is needed
(starting a run, resolving a step as failed; a Celery worker imports them
itself), so reading runs works even where the agents cannot be imported.
"""

from __future__ import annotations

import getpass
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import NamedTuple

from harness import catalog, faults
from harness.agents import get_agent, import_modules
from harness.engine import operations, runner
from harness.engine.idempotency import Cache, NoCache, RedisCache
from harness.engine.leases import SystemClock
from harness.engine.operations import Acted
from harness.engine.runner import Runtime, Sender
from harness.engine.transitions import OPERATOR
from harness.errors import BadInput, RunNotFound
from harness.inputs import MAX_GOAL, checked_json, checked_text
from harness.prices import Prices
from harness.ratelimit import RateLimiter
from harness.reads import Reads
from harness.records import JSON, Run, RunStatus, Step
from harness.replay import archive, report, rerun
from harness.replay import fork as forks
from harness.replay.report import ReplayReport
from harness.settings import Settings
from harness.store import Store
from harness.store.blobs import BlobStore
from harness.store.migrate import ensure_current
from harness.store.sql import SQLStore
from harness.worker.celeryconf import make_sender

log = logging.getLogger(__name__)

_lock = threading.Lock()
_runtime: Runtime | None = None
_settings: Settings | None = None
_pid = 0
_agents_imported: tuple[str, ...] | None = None


#: Threads of this process that run steps at once (the worker's concurrency
#: under the threads pool, set by the Celery layer); sizes the connection pool.
_step_threads: int | None = None
#: The most connections kept for step threads when their number is derived from
#: the concurrency: a step holds a connection only for each statement (about a
#: millisecond of a step that mostly waits on its model), so 16 serve hundreds
#: of threads (bench.waiting), and PostgreSQL's connections stay bounded.
STEP_CONNECTIONS = 16


def use_step_threads(count: int) -> None:
    """Size the connection pool of runtimes built from now on for ``count``
    threads running steps at once (``HARNESS_DB_POOL_SIZE`` overrides it).
    The Celery layer calls it with a threads pool's concurrency."""
    global _step_threads
    with _lock:
        _step_threads = count


def open_store(settings: Settings) -> SQLStore:
    """The configured store, migrated if it is the embedded SQLite default."""
    blobs = BlobStore(settings.blob_threshold, settings.blob_dir)
    blobs.check()
    pool = settings.db_pool_size or (_step_threads and min(_step_threads, STEP_CONNECTIONS))
    store = SQLStore.from_url(settings.database_url, pool, blobs)
    ensure_current(store.engine, auto=store.dialect == "sqlite")
    size = getattr(store.engine.pool, "size", None)
    if callable(size):
        log.info("run store: a pool of %d database connections for steps", size())
    return store


#: Builds the runtime's sender from its settings: by default a private client
#: app (:func:`make_sender`); the ``tasks`` app injects one bound to itself.
_sender_factory: Callable[[Settings], Sender] = make_sender


def use_sender(factory: Callable[[Settings], Sender]) -> None:
    """Send step messages through ``factory(settings)`` in runtimes built from now on.

    The Celery layer calls it (``tasks`` binds the sender to its own app), so
    the library never imports the Celery app.
    """
    global _sender_factory
    with _lock:
        _sender_factory = factory


#: Opens the runtime's store from its settings: by default :func:`open_store`.
_store_factory: Callable[[Settings], Store] = open_store


def use_store(factory: Callable[[Settings], Store] | None) -> None:
    """Open the store of runtimes built from now on with ``factory(settings)``;
    None: the configured one again (:func:`open_store`).

    Tests run the public API on an in-memory store this way
    (``use_store(lambda settings: MemoryStore())``, harness.store.memory).
    Deliberately not a setting: nothing in the environment selects it.
    """
    global _store_factory
    with _lock:
        _store_factory = open_store if factory is None else factory


def runtime() -> Runtime:
    """This process's runtime, built from the environment on first use."""
    global _runtime, _pid, _settings
    with _lock:
        if _runtime is not None and _pid != os.getpid():
            # Forked: the inherited connections are the parent's; forget them unclosed.
            _runtime.store.forget_connections()
            _runtime = None
        if _runtime is None:
            settings = Settings.from_env()
            store = _store_factory(settings)
            cache: Cache = NoCache()
            if settings.redis_url:
                # A hung Redis must not delay a lease renewal past the TTL.
                timeout = min(1.0, settings.lease_ttl / 6)
                cache = RedisCache.from_url(settings.redis_url, timeout)
            worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
            _runtime = Runtime(
                store,
                cache,
                SystemClock(),
                worker_id,
                settings.lease_ttl,
                _sender_factory(settings),
                step_time_limit=settings.step_time_limit,
                chain_budget=settings.chain_budget,
                crash=faults.armed(settings.crash_at),
                heartbeat_store=store.heartbeat_store(),
                limiter=RateLimiter.from_settings(
                    settings.redis_url, settings.rate_limits, settings.rate_window
                ),
                prices=Prices.parse(settings.prices),
                probes=settings.delivery_probes,
            )
            _settings = settings
            _pid = os.getpid()
        return _runtime


def reset_runtime() -> None:
    """Forget this process's runtime (tests; after the environment changed)."""
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.store.close()
        _runtime = None


def ensure_agents() -> None:
    """Import the ``HARNESS_IMPORTS`` modules, which register agents and tools.

    Once per process and set of modules (imports persist across a fork);
    resolved from the working directory first, as Celery does. Raises
    :class:`ConfigError` naming a module that cannot be imported.
    """
    global _agents_imported
    runtime()  # the settings, built once like the rest
    assert _settings is not None
    imports = _settings.imports
    if imports != _agents_imported:
        import_modules(imports)
        _agents_imported = imports


def reads() -> Reads:
    """The read service (listing, a run's steps and history, stats) on this
    process's store. Imports no agent code."""
    rt = runtime()
    assert _settings is not None
    return Reads(rt.store, rt.clock, _settings.running_alert, _settings.sweep_interval)


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
    run, created = runner.create(rt, agent_name, goal, run_id)
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


def pause_run(run_id: str, by: str | None = None) -> Run:
    """Hold the run at its next step boundary until :func:`resume_run`."""
    return Operator(by).pause(run_id).run


def resume_run(
    run_id: str,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
    by: str | None = None,
) -> Run:
    """Set a paused run moving, with its budgets raised if given."""
    return Operator(by).resume(run_id, max_tokens, max_cost_usd).run


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

    def pause(self, run_id: str) -> Acted:
        """:func:`pause_run`."""
        return operations.pause(runtime(), _run_id(run_id), self.by)

    def resume(
        self, run_id: str, max_tokens: int | None = None, max_cost_usd: float | None = None
    ) -> Acted:
        """:func:`resume_run`."""
        if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
            raise BadInput("max_tokens", f"must be from 1 to {MAX_TOKENS}, not {max_tokens}")
        if max_cost_usd is not None and not (math.isfinite(max_cost_usd) and max_cost_usd > 0):
            raise BadInput("max_cost_usd", f"must be a positive number, not {max_cost_usd}")
        return operations.resume(runtime(), _run_id(run_id), self.by, max_tokens, max_cost_usd)


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
    """Poll until the run ends or is held for an operator (waiting, paused),
    or ``timeout`` passes."""
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
    versioned, hashed document (harness.replay.archive). Raises RunNotFound."""
    return archive.export_run(runtime().store, run_id)


def import_run(document: str | bytes | dict[str, JSON]) -> archive.ImportResult:
    """Write an exported run into this store, in one transaction; idempotent.
    Raises BadArchive (nothing written) or ImportConflict (the id is taken by
    a run with other content)."""
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
    """The runs once each has ended or is held for an operator (waiting,
    paused), or as they are when ``timeout`` passes (in the order given)."""
    deadline = time.monotonic() + timeout
    settled: dict[str, Run] = {}
    while True:
        for run_id in run_ids:
            if run_id not in settled:
                run = get_run(run_id)
                if run.status.terminal or run.status.held:
                    settled[run_id] = run
        if len(settled) == len(run_ids) or time.monotonic() >= deadline:
            return [settled.get(r) or get_run(r) for r in run_ids]
        time.sleep(poll)


def replay_report(replay_id: str) -> ReplayReport:
    """The replay ``replay_id`` against its recording, as it stands now.
    Raises RunNotFound, or OperatorError if it is no replay or its recording
    was deleted."""
    return report.report(runtime().store, replay_id)
