"""Operating the harness: structured transition logs, Prometheus metrics, traces.

* :mod:`~harness.observability.logs`: one log line per transition, text or JSON;
* :mod:`~harness.observability.metrics`: ``GET /metrics`` (:func:`metrics.exposition`),
  from the store and from the worker processes' measurements;
* :mod:`~harness.observability.tracing`: OpenTelemetry spans per step (the ``otel`` extra).

None of them imports Celery: the signals that set them up in a worker's
processes are the Celery layer's (harness.celery.hooks, harness.celery.tracing).

The engine reports each committed checkpoint through :func:`committed`, one
call that costs a level check and an ``is None`` test when both are off.
None of :func:`committed`, :func:`created` and :func:`model_usage` raises:
they run right after a durable write, and a failure to log or measure it
must not turn a recorded step into a failed task (nor skip the next step's
message, nor make ``write_while_held`` write the checkpoint again). The
first failure is logged as a warning, later ones are not (a broken metrics
directory would otherwise log on every step).
"""

from __future__ import annotations

import logging

from harness.models import Usage
from harness.observability import logs, metrics
from harness.store import Checkpoint

__all__ = ["committed", "created", "logs", "metrics", "model_usage"]

log = logging.getLogger(__name__)
_warned = False


def committed(
    checkpoint: Checkpoint,
    version: int,
    *,
    kind: str | None,
    duration: float | None,
    write: float,
) -> None:
    """A checkpoint was committed at ``version``: log its transitions and
    measure it. ``kind``: the step's kind, if the checkpoint is about the step
    being executed; ``duration``: seconds since that step's claim, if it ran;
    ``write``: seconds the write took."""
    try:
        logs.transitions(checkpoint, version, kind=kind, duration=duration, write=write)
    except Exception:
        _failed("log")
    try:
        metrics.checkpoint_written(checkpoint, kind, duration, write)
    except Exception:
        _failed("measure")


def created(run_id: str, agent: str, version: int, worker: str | None) -> None:
    """A run was created (started, or forked): log it."""
    try:
        logs.created(run_id, agent, version, worker)
    except Exception:
        _failed("log")


def model_usage(model: str, usage: Usage, cost_usd: float | None) -> None:
    """A model step's result was recorded with this usage: count it by model."""
    try:
        metrics.model_usage(model, usage, cost_usd)
    except Exception:
        _failed("measure")


def _failed(what: str) -> None:
    """Warn of the first failure of this process, with its traceback."""
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "observability: could not %s a committed checkpoint (the run is unaffected; "
            "further failures in this process are not logged)",
            what,
            exc_info=True,
        )
