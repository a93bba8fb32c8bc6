"""The public API and the per-process runtime behind it.

The runtime (settings, store, cache, worker id) is built on first use in
each process, so a Celery prefork child never shares a database connection
with its parent.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from harness import faults
from harness.agents import import_modules
from harness.engine import operations, runner
from harness.engine.idempotency import Cache, NoCache, RedisCache
from harness.engine.leases import SystemClock
from harness.engine.runner import Runtime
from harness.records import JSON, Run, RunStatus, Step
from harness.settings import Settings
from harness.store.migrate import ensure_current
from harness.store.sql import SQLStore

log = logging.getLogger(__name__)

_lock = threading.Lock()
_runtime: Runtime | None = None
_settings: Settings | None = None
_pid = 0


def open_store(settings: Settings) -> SQLStore:
    """The configured store, migrated if it is the embedded SQLite default."""
    store = SQLStore.from_url(settings.database_url)
    ensure_current(store.engine, auto=store.dialect == "sqlite")
    return store


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
            import_modules(settings.imports)
            store = open_store(settings)
            cache: Cache = NoCache()
            if settings.redis_url:
                # A hung Redis must not delay a lease renewal past the TTL.
                timeout = min(1.0, settings.lease_ttl / 6)
                cache = RedisCache.from_url(settings.redis_url, timeout)
            worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
            from tasks import sender  # the Celery glue; imported late to keep layers apart

            _runtime = Runtime(
                store,
                cache,
                SystemClock(),
                worker_id,
                settings.lease_ttl,
                sender(settings),
                step_time_limit=settings.step_time_limit,
                crash=faults.armed(settings.crash_at),
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


def start_run(agent_name: str, goal: str, run_id: str | None = None) -> str:
    """Create a run and dispatch its first step. Idempotent on an explicit ``run_id``."""
    return runner.create_run(runtime(), agent_name, goal, run_id)


def get_run(run_id: str) -> Run:
    """The run with the step at its cursor. Raises :class:`RunNotFound`."""
    return runtime().store.load(run_id)


def get_steps(run_id: str) -> list[Step]:
    rt = runtime()
    rt.store.load(run_id)  # RunNotFound for an unknown id
    return rt.store.steps(run_id)


def cancel_run(run_id: str, reason: str = "cancelled by operator") -> Run:
    """Stop a run. A step executing now finishes, but its result is not recorded."""
    return operations.cancel(runtime(), run_id, reason)


def resolve_run(run_id: str, decision: str, result: JSON = None, force: bool = False) -> Run:
    """Settle a run's in-doubt step: ``retry``, ``succeeded`` (with its result) or ``fail``."""
    return operations.resolve(runtime(), run_id, operations.Decision(decision), result, force)


def stats() -> dict[str, JSON]:
    """Recovery metrics, counted durably in the store (``harness stats``)."""
    rt = runtime()
    assert _settings is not None
    events = rt.store.event_counts()
    return {
        "recovered_running_steps": events.get("recovered_running", 0),
        "stale_writes_rejected": rt.store.counters().get("stale_writes", 0),
        "lease_takeovers": events.get("lease_takeover", 0),
        "in_doubt_steps": events.get("in_doubt", 0),
        "sweeper_redispatches": events.get("redispatched", 0),
        "running_steps_older_than_alert": rt.store.running_steps_started_before(
            rt.clock.now() - _settings.running_alert
        ),
        "running_alert_seconds": _settings.running_alert,
        "runs_by_status": rt.store.run_counts(),
    }


def wait_for(run_id: str, timeout: float, poll: float = 0.2) -> Run:
    """Poll until the run is terminal or waiting, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        run = get_run(run_id)
        if run.status.terminal or run.status is RunStatus.WAITING:
            return run
        if time.monotonic() >= deadline:
            return run
        time.sleep(poll)
