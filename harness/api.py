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

from harness.agents import get_agent, import_modules
from harness.errors import StaleWriteError
from harness.idempotency import Cache, NoCache, RedisCache
from harness.leases import SystemClock
from harness.migrate import ensure_current
from harness.records import Run, RunStatus, Step, StepKind, StepStatus
from harness.runner import Runtime, commit
from harness.settings import Settings
from harness.sqlstore import SQLStore
from harness.store import Checkpoint, EventDraft, RunPatch

log = logging.getLogger(__name__)

_lock = threading.Lock()
_runtime: Runtime | None = None
_pid = 0


def open_store(settings: Settings) -> SQLStore:
    """The configured store, migrated if it is the embedded SQLite default."""
    store = SQLStore.from_url(settings.database_url)
    ensure_current(store.engine, auto=store.dialect == "sqlite")
    return store


def _dispatch(run_id: str, cursor: int) -> None:
    from tasks import run_step  # the Celery glue; imported late to keep layers apart

    run_step.apply_async((run_id,), {"cursor": cursor})


def runtime() -> Runtime:
    """This process's runtime, built from the environment on first use."""
    global _runtime, _pid
    with _lock:
        if _runtime is not None and _pid != os.getpid():
            # Forked: the inherited connections are the parent's; forget them unclosed.
            _runtime.store.engine.dispose(close=False)
            _runtime = None
        if _runtime is None:
            settings = Settings.from_env()
            import_modules(settings.imports)
            store = open_store(settings)
            cache: Cache = NoCache()
            if settings.redis_url:
                cache = RedisCache.from_url(settings.redis_url)
            worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
            _runtime = Runtime(store, cache, SystemClock(), worker_id, settings.lease_ttl,
                               _dispatch)
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
    rt = runtime()
    get_agent(agent_name)
    now = rt.clock.now()
    run_id = run_id or uuid.uuid4().hex
    run = Run(run_id, agent_name, goal, RunStatus.PENDING, cursor=0, version=1, step_count=1,
              created_at=now, updated_at=now)
    first = Step(run_id, 0, StepKind.MODEL, StepStatus.PENDING, args={"turn": 0})
    stored, created = rt.store.create_run(run, first, wake_at=now + rt.lease_ttl)
    if created:
        log.info("run=%s step=0 v=%d created for agent %s", run_id, stored.version, agent_name)
        try:
            rt.dispatch(run_id, 0)
        except Exception as err:
            log.warning("run=%s first dispatch failed (%s); the sweeper will start it",
                        run_id, err)
    return run_id


def get_run(run_id: str) -> Run:
    """The run with the step at its cursor. Raises :class:`RunNotFound`."""
    return runtime().store.load(run_id)


def get_steps(run_id: str) -> list[Step]:
    rt = runtime()
    rt.store.load(run_id)  # RunNotFound for an unknown id
    return rt.store.steps(run_id)


def cancel_run(run_id: str, reason: str = "cancelled by operator") -> Run:
    """Stop a run. A step executing now finishes, but its result is not recorded."""
    rt = runtime()
    while True:
        run = rt.store.load(run_id)
        if run.status.terminal:
            return run
        try:
            commit(rt, Checkpoint(
                run_id, run.version, "operator", rt.clock.now(),
                run=RunPatch(status=RunStatus.CANCELLED, owner=None, lease_expires_at=None,
                             wake_at=None, error=reason),
                events=(EventDraft(RunStatus.CANCELLED, run.status, detail=reason),),
            ))
        except StaleWriteError:
            continue
        return rt.store.load(run_id)


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
