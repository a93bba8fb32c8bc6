"""The Celery half of step tracing: the signals that set OpenTelemetry up in
each worker process and carry a step's span context across each message.

Which process sets it up, and when (after the fork; flushed at shutdown),
and how a run stays one trace across hops, is explained in
harness.observability.tracing, the OpenTelemetry half, which this module
drives and which knows nothing of Celery.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from celery import Celery, signals

from harness.celery.config import STEP_TASK
from harness.errors import HarnessError
from harness.observability.tracing import (
    HEADERS,
    check,
    finished,
    forget,
    inject,
    receive,
    setup,
    shutdown,
)
from harness.settings import Settings

log = logging.getLogger(__name__)

#: The apps whose workers are traced; the signals are connected with the first.
_apps: list[Celery] = []
#: Set up failed in this process (or the one it was forked from): said once.
_refused = False


def _message_headers(request: Any) -> dict[str, Any]:
    """Trace headers of the message a task runs: top-level in a worker's
    request, under ``headers`` for ``Task.apply``."""
    nested = getattr(request, "headers", None) or {}
    found = {k: getattr(request, k, None) or nested.get(k) for k in HEADERS}
    return {k: v for k, v in found.items() if v is not None}


def _start(settings: Settings, prefork_parent: bool = False) -> None:
    """Set up tracing in a worker process; a prefork parent only checks that
    its children can. A process that cannot says so once, and so do not
    the children it forks."""
    global _refused
    if _refused:
        return
    try:
        if prefork_parent:
            check(settings)
        else:
            setup(settings)
    except HarnessError as err:
        _refused = True
        log.error("tracing off: %s", err)


def _prefork(worker: Any) -> bool:
    pool = getattr(worker, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    return "prefork" in str(name) or name == "processes"


def instrument(app: Celery, settings: Callable[[], Settings]) -> None:
    """Trace the steps that ``app``'s workers run, if the settings ask for it.

    Connects Celery's signals once per process (a second call, or a second
    app, adds nothing but the app): set up in each pool process after the
    fork, flush on its shutdown, carry the step context across each step
    message. ``harness.celery.install`` calls it; ``settings`` gives the
    worker's settings (read once, where the worker starts).
    """
    if any(known is app for known in _apps):
        return
    _apps.append(app)
    if len(_apps) > 1:
        return

    os.register_at_fork(after_in_child=forget)

    def worker_started(instance: Any = None, **_: Any) -> None:
        # Logging is configured by now, and no task has started yet. Under
        # solo or threads the worker is the process that runs the steps.
        if any(getattr(instance, "app", None) is known for known in _apps):
            _start(settings(), prefork_parent=_prefork(instance))

    def child_started(**_: Any) -> None:
        _start(settings())

    def stopped(**_: Any) -> None:
        shutdown()

    def publishing(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if sender == STEP_TASK and isinstance(headers, dict):
            inject(headers)

    def task_started(task: Any = None, **_: Any) -> None:
        if getattr(task, "name", None) == STEP_TASK:
            receive(_message_headers(task.request))
        else:
            finished()

    def task_done(**_: Any) -> None:
        finished()

    for signal, receiver in (
        (signals.celeryd_after_setup, worker_started),
        (signals.worker_process_init, child_started),
        (signals.worker_process_shutdown, stopped),
        (signals.worker_shutdown, stopped),
        (signals.before_task_publish, publishing),
        (signals.task_prerun, task_started),
        (signals.task_postrun, task_done),
    ):
        signal.connect(receiver, weak=False)
