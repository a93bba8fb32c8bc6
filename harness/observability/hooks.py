"""The Celery signals that set logs and metrics up in a worker's processes.

The ``tasks`` app (or a user's own app, through the Celery layer) calls
:func:`install_celery_hooks` once. Settings are read when the signals fire,
in the process they concern, never at import.
"""

from __future__ import annotations

import os
from typing import Any

from harness.observability import logs, metrics
from harness.settings import Settings


def _pool_is_prefork(worker: Any) -> bool:
    """The worker's pool forks children. ``worker_init`` fires before Celery
    resolves ``pool_cls``, so it may still be a name (``prefork``,
    ``processes``, ``custom``, ``module:Class``): resolved here the way
    Celery will, and a pool class deriving from prefork's counts too."""
    from celery.concurrency import get_implementation
    from celery.concurrency.prefork import TaskPool

    pool = getattr(worker, "pool_cls", None)
    if isinstance(pool, str):
        try:
            pool = get_implementation(pool)
        except Exception:  # a pool Celery will refuse itself; guess from its name
            return "prefork" in pool or pool == "processes"
    return isinstance(pool, type) and issubclass(pool, TaskPool)


def _worker_starting(sender: Any = None, **_: Any) -> None:
    """A worker's main process. Under prefork it executes no step (its
    children measure); under solo or threads it is the one that does. With
    ``HARNESS_METRICS_PORT`` it serves its host's metrics files."""
    settings = Settings.from_env()
    node = str(getattr(sender, "hostname", None) or "worker")
    if not _pool_is_prefork(sender):
        metrics.start_worker_process(settings, metrics.slot_identifier(node, "main"))
    metrics.serve(settings)


def _pool_child_starting(sender: Any = None, **_: Any) -> None:
    """A prefork pool child: its files are named after its slot (billiard's
    child index), which its replacement inherits."""
    from billiard.process import current_process

    slot = getattr(current_process(), "index", None)
    node = str(sender or "worker")
    identifier = metrics.slot_identifier(node, "pid" + str(os.getpid()) if slot is None else slot)
    metrics.start_worker_process(Settings.from_env(), identifier)


def install_celery_hooks() -> None:
    """Connect the hooks: JSON logs under ``HARNESS_LOG_FORMAT=json``, and
    worker metrics under ``HARNESS_METRICS_DIR``. Idempotent."""
    from celery.signals import worker_init, worker_process_init

    logs.install_celery_hooks()
    worker_init.connect(_worker_starting, weak=False, dispatch_uid=__name__ + ".worker")
    worker_process_init.connect(_pool_child_starting, weak=False, dispatch_uid=__name__ + ".child")
