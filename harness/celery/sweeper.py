"""The sweeper inside ``celery beat``: it sweeps in beat's own process.

A sweep sent as a message waits behind the work it should rescue: behind a
backlog in the queue, for a free slot when every worker is busy with long
steps, and while the workers are down the sweeps pile up. Beat is the one
sweeper process anyway, so its scheduler runs the sweep itself when the
sweep entry is due, and sends any other entry as usual. The runs it
re-sends take the recovery lane (:mod:`harness.celery.config`), so
recovery takes lease TTL + sweep interval + one hop whatever the backlog.

``tasks.sweep`` remains for a sweep on demand, and ``harness sweep`` runs
one from the command line. Every sweep is recorded in the store; while none
comes from beat, a worker takes the sweep over (harness.celery.takeover).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import beat
from celery.beat import PersistentScheduler, ScheduleEntry

from harness.celery import health
from harness.celery.config import SWEEP_TASK
from harness.engine import recovery
from harness.engine.runtime import Runtime
from harness.errors import ConfigError, StoreError
from harness.settings import Settings
from harness.store import SweepKind

log = logging.getLogger(__name__)


#: This process's runtime and settings, from its composition root: beat builds
#: its scheduler from a name (``beat_scheduler``), so :func:`harness.celery.install`
#: hands them over (:func:`use`) where it sets that name.
_runtime: Callable[[], Runtime] | None = None
_settings: Callable[[], Settings] | None = None


def use(runtime: Callable[[], Runtime], settings: Callable[[], Settings]) -> None:
    """Sweep in beat on ``runtime()``; ``settings()`` says where beat's heartbeat goes."""
    global _runtime, _settings
    _runtime, _settings = runtime, settings


def _root() -> tuple[Runtime, Settings]:
    if _runtime is None or _settings is None:
        raise ConfigError(
            "beat's scheduler is harness.celery.sweeper:Scheduler, but its app was not "
            "installed: call harness.celery.install(app) where the app is created"
        )
    return _runtime(), _settings()


def sweep(rt: Runtime, kind: SweepKind = SweepKind.BEAT) -> int:
    """One sweep in this process (recorded as ``kind``) on ``rt``, each
    re-dispatch logged; returns how many."""
    sent = recovery.sweep(rt, kind=kind)
    for item in sent:
        log.warning(
            "sweeper re-dispatched run=%s step=%d: %s", item.run_id, item.cursor, item.reason
        )
    return len(sent)


class InProcessSweep(beat.Scheduler):
    """Runs the sweep entry in beat's process; any other entry is sent as usual.

    Mix it into a scheduler class of your own (``class Schedule(InProcessSweep,
    DatabaseScheduler)``); without it, that scheduler sends the sweep as a
    ``tasks.sweep`` message on the recovery lane, which works, but waits for a
    free worker.
    """

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        if entry.task != SWEEP_TASK:
            super().apply_entry(entry, producer)
            return
        try:
            rt, settings = _root()
            sweep(rt)
        except StoreError as err:  # the store may be down for a while
            log.warning("sweep failed (%s); the next one is due in %s", err, entry.schedule)
        except Exception:
            log.exception("sweep failed; the next one is due in %s", entry.schedule)
        else:
            _swept(settings)


def _swept(settings: Settings) -> None:
    """Beat's liveness: with ``HARNESS_WORKER_HEARTBEAT_FILE`` set for beat, each
    sweep that went through refreshes that file, so ``harness health --worker``
    says whether sweeps happen. Unset, nothing is written: the default file is
    a local worker's, which beat must not keep looking alive."""
    path = settings.heartbeat_file
    if path is None:
        return
    try:
        health.touch(path, "beat")
    except OSError as err:
        log.warning("beat heartbeat: cannot write %s: %s", path, err)


class Scheduler(InProcessSweep, PersistentScheduler):
    """Beat's scheduler (``beat_scheduler``): Celery's own, sweeping in-process."""
