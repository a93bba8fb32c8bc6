"""Named crash points for chaos tests. They do nothing unless armed.

Arm them with ``HARNESS_CRASH_AT=point[,point...]``: the process SIGKILLs
itself the first time it reaches an armed point, exactly as an OOM kill or
``kill -9`` would, so nothing after it runs (no ``finally``, no ack). A point
may name a step kind, ``after_running_checkpoint.tool``, to fire only on
steps of that kind. Points:

* ``after_running_checkpoint``: the step is claimed, nothing called yet (durably
  RUNNING, or, for a step that goes straight through, nothing written at all);
* ``after_tool_returned``: the tool returned; its result is not stored anywhere;
* ``after_model_returned``: a model's response is recorded under the step's
  key; the step's checkpoint is not written;
* ``after_result_checkpoint``: the result is committed; the next step is not sent;
* ``during_lease_renewal``: a heartbeat is about to renew the lease;
* ``before_parent_answered``: a child run's last checkpoint is committed; its
  parent's step has not been given its end.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

POINTS = (
    "after_running_checkpoint",
    "after_tool_returned",
    "after_model_returned",
    "after_result_checkpoint",
    "during_lease_renewal",
    "before_parent_answered",
)

CrashPoints = Callable[[str, str], None]
"""``crash(point, step_kind)``: kill this process if ``point`` is armed for that kind."""


def _never(point: str, kind: str) -> None:
    pass


#: The production value: no point is armed.
NEVER: CrashPoints = _never


def armed(points: Iterable[str]) -> CrashPoints:
    """A crash function that kills this process at any of ``points``."""
    chosen = frozenset(points)
    unknown = {spec for spec in chosen if spec.partition(".")[0] not in POINTS}
    if unknown:
        raise ValueError(f"unknown crash points {sorted(unknown)}; known: {', '.join(POINTS)}")
    if not chosen:
        return NEVER

    def crash(point: str, kind: str) -> None:
        if point in chosen or f"{point}.{kind}" in chosen:
            log.critical("crash point %s armed: SIGKILL pid %d", point, os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)

    return crash
