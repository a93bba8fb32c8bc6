"""The Celery application: thin tasks that call the harness library.

    celery -A tasks worker     # carry runs forward
    celery -A tasks beat       # the recovery sweeper
    celery -A tasks flower     # task-level monitoring
"""

from __future__ import annotations

import logging

from celery import Celery

from harness import api, recovery, runner

app = Celery("tasks")
app.config_from_object("celeryconfig")

log = logging.getLogger(__name__)


@app.task(acks_late=True, reject_on_worker_lost=True)
def run_step(run_id: str, cursor: int | None = None) -> str:
    """Carry ``run_id`` forward by one step (see harness.runner)."""
    return runner.run_step(api.runtime(), run_id, cursor).value


@app.task
def sweep() -> int:
    """Re-dispatch runs that should be moving but are not (see harness.recovery)."""
    sent = recovery.sweep(api.runtime())
    for item in sent:
        log.warning("sweeper re-dispatched run=%s step=%d: %s", item.run_id, item.cursor,
                    item.reason)
    return len(sent)
