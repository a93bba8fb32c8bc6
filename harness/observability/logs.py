"""Structured logs: one line per transition, text or JSON.

Every transition a checkpoint writes (the events of the flight recorder) is
logged once, at INFO, on the ``harness.transitions`` logger, with the
fields ``run_id``, ``step``, ``kind``, ``from``, ``to``, ``version``,
``worker``, ``duration`` and ``write``:

* ``kind``: the step's kind (``model`` or ``tool``), null for a transition
  of the run alone (a sweeper re-send, a cancel);
* ``duration``: seconds since the step began executing in this attempt, up to
  the commit of this checkpoint; null when no step was executing (a claim, a
  cancel, a re-send);
* ``write``: seconds the checkpoint's own write took (its round trips).

Only the standard :mod:`logging` module is used: records carry the fields as
an attribute (``record.transition``), and the format is a formatter's job.
So Celery's logging setup (its handlers, ``--loglevel``, ``--logfile``)
keeps working; ``HARNESS_LOG_FORMAT=json`` swaps in :class:`JsonFormatter`
on those handlers (:func:`use_json_on`, called from Celery's
``after_setup_logger`` signals) or on the root logger's (:func:`configure`,
for the CLI and the API). The text line is readable as it is::

    run=4f0c… step=1 kind=tool v=5 pending -> done worker=host:811:a1b2c3 duration=0.012s …
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from harness.records import JSON
from harness.settings import Settings
from harness.store import Checkpoint

#: The logger of transition lines.
TRANSITIONS = "harness.transitions"
#: The attribute of a log record that holds a transition's fields.
FIELDS = "transition"
#: Attributes every LogRecord has: not extra fields of a JSON line.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
#: Extras never written to a JSON line: uvicorn's copy of the message with
#: ANSI colour codes.
_DROPPED = frozenset({"color_message"})
#: Extra attributes Celery's task logger adds: worth a JSON field each.
_CELERY_FIELDS = ("task_id", "task_name")

log = logging.getLogger(TRANSITIONS)


def transitions(
    checkpoint: Checkpoint,
    version: int,
    *,
    kind: str | None = None,
    duration: float | None = None,
    write: float | None = None,
) -> None:
    """Log each transition ``checkpoint`` wrote, committed at ``version``.
    Costs one level check when INFO is off for ``harness.transitions``."""
    if not log.isEnabledFor(logging.INFO):
        return
    for event in checkpoint.events:
        fields: dict[str, JSON] = {
            "run_id": checkpoint.run_id,
            "step": event.step_index,
            "kind": kind if event.step_index is not None else None,
            "from": event.from_status and str(event.from_status),
            "to": str(event.to_status),
            "version": version,
            "worker": checkpoint.worker,
            "duration": None if duration is None else round(duration, 6),
            "write": None if write is None else round(write, 6),
        }
        if event.detail:
            fields["detail"] = event.detail
        log.info(text_line(fields), extra={FIELDS: fields})


def created(run_id: str, agent: str, version: int, worker: str | None) -> None:
    """Log a new run: the transition to ``pending`` that no checkpoint writes."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields: dict[str, JSON] = {
        "run_id": run_id,
        "step": None,
        "kind": None,
        "from": None,
        "to": "pending",
        "version": version,
        "worker": worker,
        "duration": None,
        "write": None,
        "detail": f"agent={agent}",
    }
    log.info(text_line(fields), extra={FIELDS: fields})


def text_line(fields: dict[str, JSON]) -> str:
    """The readable message of a transition: the fields on one line, nulls left out."""
    step = "-" if fields["step"] is None else fields["step"]
    parts = [f"run={fields['run_id']} step={step}"]
    if fields.get("kind"):
        parts.append(f"kind={fields['kind']}")
    parts.append(f"v={fields['version']} {fields['from'] or '-'} -> {fields['to']}")
    if fields.get("worker"):
        parts.append(f"worker={fields['worker']}")
    for name in ("duration", "write"):
        if fields.get(name) is not None:
            parts.append(f"{name}={fields[name]:.3f}s")
    line = " ".join(parts)
    return f"{line} ({fields['detail']})" if fields.get("detail") else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, the transition fields when the record is a transition, a
    Celery task's id and name when it has them, any other ``extra`` given,
    and ``exc_info`` as text."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            line.update(fields)
        for name in _CELERY_FIELDS:
            value = getattr(record, name, None)
            if value not in (None, "???"):
                line[name] = value
        for name, value in vars(record).items():
            if (
                name not in _STANDARD
                and name not in _DROPPED
                and name != FIELDS
                and name not in line
            ):
                line[name] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def _iso(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def use_json_on(handlers: Iterable[logging.Handler]) -> None:
    """Make ``handlers`` write JSON lines (idempotent)."""
    for handler in handlers:
        if not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(JsonFormatter())


#: The text format of processes that are not Celery's (the CLI, the API).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(settings: Settings, level: int = logging.INFO) -> None:
    """Logging for a process that is not a Celery worker or beat (``harness
    serve``, the CLI): a stderr handler on the root logger if it has none,
    at ``level``, in ``HARNESS_LOG_FORMAT``. Idempotent."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    if settings.log_format == "json":
        use_json_on(root.handlers)
