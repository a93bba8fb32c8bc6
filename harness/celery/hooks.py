"""The Celery signals that set logs and metrics up in a worker's processes,
and stop the MCP servers a worker process started when it stops.

The Celery half of harness.observability (which imports no Celery): the
Celery layer (:func:`harness.celery.install`) calls :func:`install_celery_hooks`
once, with the worker's settings as its composition root reads them; they
are asked for when the signals fire, in the process they concern, never at
import.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from billiard.process import current_process
from celery.concurrency import get_implementation
from celery.concurrency.prefork import TaskPool
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)

from harness import aio
from harness.observability import logs, metrics
from harness.settings import Settings

#: The worker's settings (install_celery_hooks); read when a signal fires.
_settings: Callable[[], Settings] = Settings.from_env


def _pool_is_prefork(worker: Any) -> bool:
    """The worker's pool forks children. ``worker_init`` fires before Celery
    resolves ``pool_cls``, so it may still be a name (``prefork``,
    ``processes``, ``custom``, ``module:Class``): resolved here the way
    Celery will, and a pool class deriving from prefork's counts too."""
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
    settings = _settings()
    node = str(getattr(sender, "hostname", None) or "worker")
    if not _pool_is_prefork(sender):
        metrics.start_worker_process(settings, metrics.slot_identifier(node, "main"))
    metrics.serve(settings)


def _pool_child_starting(sender: Any = None, **_: Any) -> None:
    """A prefork pool child: its files are named after its slot (billiard's
    child index), which its replacement inherits."""
    slot = getattr(current_process(), "index", None)
    node = str(sender or "worker")
    identifier = metrics.slot_identifier(node, "pid" + str(os.getpid()) if slot is None else slot)
    metrics.start_worker_process(_settings(), identifier)


def _stop_mcp_servers(**_: Any) -> None:
    """A worker process stops: close its MCP sessions, so each stdio server
    it started sees its input end and exits (harness.toolsets.sessions)."""
    sessions = sys.modules.get("harness.toolsets.sessions")  # loaded by a first MCP call
    if sessions is not None:
        sessions.close_all()


def _celery_logger_ready(logger: logging.Logger | None = None, **_: Any) -> None:
    """Celery set up a logger (its root, or the task logger): JSON if asked."""
    if logger is None or _settings().log_format != "json":
        return
    logs.use_json_on(logger.handlers)


def _process_stopping(**_: Any) -> None:
    """A worker, or a prefork pool child, is stopping: close the event loops
    its ``async def`` tools and models ran on (harness.aio), cancelling what
    they still hold, so their ``finally`` blocks and connections close."""
    aio.close_all()


def install_celery_hooks(settings: Callable[[], Settings]) -> None:
    """Connect the hooks: JSON logs under ``HARNESS_LOG_FORMAT=json`` (Celery's
    own handlers: worker, beat, task logger), and worker metrics under
    ``HARNESS_METRICS_DIR``. Idempotent; ``settings()`` is asked when the
    signals fire."""
    global _settings
    _settings = settings
    after_setup_logger.connect(_celery_logger_ready, weak=False, dispatch_uid=__name__ + ".root")
    after_setup_task_logger.connect(
        _celery_logger_ready, weak=False, dispatch_uid=__name__ + ".task"
    )
    worker_init.connect(_worker_starting, weak=False, dispatch_uid=__name__ + ".worker")
    worker_process_init.connect(_pool_child_starting, weak=False, dispatch_uid=__name__ + ".child")
    worker_process_shutdown.connect(
        _process_stopping, weak=False, dispatch_uid=__name__ + ".child-loops"
    )
    worker_shutdown.connect(_process_stopping, weak=False, dispatch_uid=__name__ + ".loops")
    worker_process_shutdown.connect(_stop_mcp_servers, weak=False, dispatch_uid=__name__ + ".mcp1")
    worker_shutdown.connect(_stop_mcp_servers, weak=False, dispatch_uid=__name__ + ".mcp")
