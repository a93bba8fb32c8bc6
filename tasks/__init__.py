"""The Celery application: thin tasks that call the harness library.

celery -A tasks worker     # carry runs forward (the step queue and the recovery lane)
celery -A tasks beat       # the recovery sweeper: it sweeps in its own process
celery -A tasks flower     # task-level monitoring

Importing this module reads no variable and creates nothing: Celery asks
``celeryconfig`` for the configuration when it first needs it. The library
never imports this module; it is handed this app's sender (``api.use_sender``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import worker_init

import celeryconfig
from harness import api
from harness.engine import runner
from harness.engine.runner import Sender
from harness.errors import StoreError
from harness.settings import Settings
from harness.worker import health, sweeper
from harness.worker.celeryconf import (
    STEP_TASK,
    SWEEP_TASK,
    celery_settings,
    make_sender,
    sends_delayed,
    step_options,
)

app = Celery("tasks")
# A promise: Celery calls it when the configuration is first read, not at import.
app.add_defaults(celeryconfig.from_env)

log = logging.getLogger(__name__)


@app.task(
    name=STEP_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    # The store was unreachable (a database restart, a dropped connection): try
    # again with backoff. If retries run out, the sweeper resumes the run later.
    autoretry_for=(StoreError,),
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=12,
)
def run_step(run_id: str, cursor: int | None = None) -> str:
    """Carry ``run_id`` forward by one step (see harness.engine.runner)."""
    return runner.run_step(api.runtime(), run_id, cursor).value


# Acked on receipt: a sweep lost with its worker is harmless, the next one comes.
@app.task(name=SWEEP_TASK, acks_late=False)
def sweep() -> int:
    """One sweep on demand; beat sweeps in its own process (harness.worker.sweeper)."""
    return sweeper.sweep()


def sender(settings: Settings) -> Sender:
    """Send step messages through this app and its producer pool.

    Only when the app is configured for the same broker as ``settings`` (in a
    worker or beat, always); otherwise, as when the environment changed after
    the app read it, through a client of their own.
    """
    wanted = celery_settings(settings)
    if any(app.conf.get(key) != value for key, value in wanted.items() if key.startswith("broker")):
        return make_sender(settings)

    def send(run_id: str, cursor: int, *, recovery: bool = False, delay: float = 0.0) -> None:
        if delay > 0 and not sends_delayed(settings, delay):
            return  # the sweeper wakes it at its wake_at
        run_step.apply_async((run_id,), {"cursor": cursor}, **step_options(recovery, delay))

    return send


api.use_sender(sender)

# Liveness for a supervisor: a heartbeat file that only a consuming worker keeps
# fresh, read by `harness health --worker` (harness.worker.health).
app.steps["consumer"].add(health.Heartbeat)


@worker_init.connect
def _size_the_connection_pool(sender: Any, **_: Any) -> None:
    """Under the threads pool every step of this worker shares one process and
    its store: size the connection pool for them all (lease renewals have a
    pool of their own). ``HARNESS_DB_POOL_SIZE`` overrides it."""
    pool = getattr(sender, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    if "thread" in str(name):
        api.use_step_threads(int(sender.concurrency))
