"""The Celery application: thin tasks that call the harness library.

celery -A tasks worker     # carry runs forward
celery -A tasks beat       # the recovery sweeper
celery -A tasks flower     # task-level monitoring
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery import Celery

import celeryconfig
from harness import api
from harness.engine import recovery, runner
from harness.errors import StoreError
from harness.settings import Settings

app = Celery("tasks")
app.config_from_object("celeryconfig")

log = logging.getLogger(__name__)


@app.task(
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


@app.task
def sweep() -> int:
    """Re-dispatch runs that should be moving but are not (see harness.engine.recovery)."""
    sent = recovery.sweep(api.runtime())
    for item in sent:
        log.warning(
            "sweeper re-dispatched run=%s step=%d: %s", item.run_id, item.cursor, item.reason
        )
    return len(sent)


def sender(settings: Settings) -> Callable[[str, int], None]:
    """Send ``run_step`` messages to the broker that ``settings`` name.

    A client app of its own, so a process can dispatch for the configuration
    it was given, whatever the environment was when ``tasks`` was imported.
    """
    client = Celery("harness-sender", set_as_current=False)
    client.conf.update(celeryconfig.settings_for(settings))
    name = run_step.name

    def send(run_id: str, cursor: int) -> None:
        client.send_task(name, (run_id,), {"cursor": cursor})

    return send
