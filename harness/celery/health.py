"""Worker liveness: a heartbeat file that only a consuming worker keeps fresh.

A worker can be alive as a process and still move nothing: its consumer
stuck after a broker restart, its event loop blocked. A supervisor cannot see
that from the process table, so the worker proves it is consuming instead:

* :class:`Heartbeat`, a bootstep of the worker's *consumer*, touches the
  heartbeat file from the consumer's own event loop, once a second, and only
  while the consumer is connected. With the event loop (Redis, RabbitMQ) it
  is a timer of that loop; without one (the embedded ``filesystem://``
  broker) it runs between two reads of the broker. A wedged consumer, a
  broker connection being re-established, a stopped process: the file stops
  being refreshed.
* :func:`check` (``harness health --worker``) reads the file's age: healthy
  when it was refreshed within ``max_age`` seconds. A supervisor (Docker's
  ``healthcheck``, a Kubernetes liveness probe) runs it and restarts the
  worker when it fails.

With the solo pool (the embedded default) a step runs inside the consumer
loop, so the file is not refreshed while a step runs: give ``--max-age``
more than the longest step there. The prefork pool runs steps in child
processes and keeps refreshing it.

The file is ``HARNESS_WORKER_HEARTBEAT_FILE`` (default
``$HARNESS_HOME/health/worker.heartbeat``): one per worker, so give each
worker that shares a ``HARNESS_HOME`` a file of its own.

Recovery needs the sweeps too: :func:`check_sweeps` (``harness health
--sweeps``) reads the last sweep recorded in the store, healthy when one ran
within ``max_age`` (by default :func:`sweeps_max_age`: the intervals after
which a worker takes the sweep over, and one more), and says so when a
worker sweeps because beat does not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from celery import bootsteps

from harness.engine import recovery
from harness.settings import Settings
from harness.store import SCHEDULED_SWEEPS, SweepKind, Sweeps

log = logging.getLogger(__name__)

#: Seconds between two refreshes of the heartbeat file.
INTERVAL = 1.0
#: Default ``--max-age``: a missed refresh or two is no reason to restart a worker.
DEFAULT_MAX_AGE = 30.0


@dataclass(frozen=True)
class Health:
    """What the heartbeat file says about the worker that writes it."""

    healthy: bool
    path: str
    max_age: float
    age: float | None  # seconds since the last refresh; None without a file
    worker: str | None  # the Celery node name, as the worker wrote it
    pid: int | None

    @property
    def line(self) -> str:
        who = f"worker {self.worker or '?'} (pid {self.pid or '?'})"
        if self.age is None:
            return f"unhealthy: no worker heartbeat at {self.path}"
        if self.healthy:
            return f"healthy: {who} heartbeat {self.age:.1f}s ago"
        return (
            f"unhealthy: {who} heartbeat {self.age:.1f}s ago, "
            f"older than {self.max_age:g}s (wedged, stopped or disconnected)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "path": self.path,
            "max_age": self.max_age,
            "age": self.age,
            "worker": self.worker,
            "pid": self.pid,
        }


def check(path: Path, max_age: float = DEFAULT_MAX_AGE, now: float | None = None) -> Health:
    """Healthy when the heartbeat file at ``path`` was refreshed within ``max_age`` s."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return Health(False, str(path), max_age, None, None, None)
    info: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(path.read_text())
        info = loaded if isinstance(loaded, dict) else {}
    age = max(0.0, (time.time() if now is None else now) - mtime)
    pid = info.get("pid")
    return Health(
        age <= max_age,
        str(path),
        max_age,
        age,
        str(info["worker"]) if "worker" in info else None,
        pid if isinstance(pid, int) else None,
    )


def write(path: Path, worker: str) -> None:
    """Create the heartbeat file (atomically), naming the worker that owns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(json.dumps({"worker": worker, "pid": os.getpid()}))
    os.replace(staging, path)


def touch(path: Path, worker: str) -> None:
    """Refresh the heartbeat file; re-create it if someone removed it."""
    try:
        os.utime(path)
    except FileNotFoundError:
        write(path, worker)


class Heartbeat(bootsteps.StartStopStep):
    """Consumer bootstep: refresh the heartbeat file while this consumer consumes.

    Started each time the consumer (re)connects, stopped when the connection
    is lost (and its timer entry cancelled with the connection's), removed at
    shutdown. Add it with ``app.steps["consumer"].add(bootstep(settings))``.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)
    #: The worker's settings, as its composition root reads them (harness.celery).
    settings: ClassVar[Callable[[], Settings]]

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.path = type(self).settings().worker_heartbeat_file
        self._timer: Any = None
        self._last = 0.0

    def start(self, c: Any) -> None:
        self._refresh(c, write)
        if c.hub is not None:
            # A timer of the event loop: it fires only while the loop turns.
            self._timer = c.hub.call_repeatedly(INTERVAL, self._beat, c)
        else:
            # No event loop (synloop): refresh between two reads of the broker.
            pending = type(c).perform_pending_operations

            def between_reads() -> None:
                pending(c)
                self._beat(c)

            c.perform_pending_operations = between_reads

    def _beat(self, c: Any) -> None:
        if c.connection is None or c.blueprint.state != bootsteps.RUN:  # type: ignore[attr-defined]
            return  # disconnected, or stopping: not consuming
        if c.hub is not None or time.monotonic() - self._last >= INTERVAL:
            self._refresh(c, touch)

    def _refresh(self, c: Any, how: Callable[[Path, str], None]) -> None:
        self._last = time.monotonic()
        try:
            how(self.path, c.hostname)
        except OSError as err:  # the health check will say so; the worker carries on
            log.warning("worker heartbeat: cannot write %s: %s", self.path, err)

    def stop(self, c: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        c.__dict__.pop("perform_pending_operations", None)

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.path.read_text()).get("pid") == os.getpid():
                self.path.unlink()


@dataclass(frozen=True)
class SweepHealth:
    """What the store says about the sweeps: healthy when the last one began
    within ``max_age`` seconds (``age``; None: none recorded). ``kind`` and
    ``worker``: who ran it; ``beat_age``: since beat's last (None: none)."""

    healthy: bool
    max_age: float
    age: float | None
    kind: str | None
    worker: str | None
    beat_age: float | None
    interval: float

    @property
    def line(self) -> str:
        if self.age is None:
            return (
                "unhealthy: no sweep recorded: is `celery beat` running? (workers take the "
                f"sweep over once up for {recovery.STALE * self.interval:g}s)"
            )
        last = f"last sweep {self.age:.1f}s ago by {self.kind} {self.worker}"
        if not self.healthy:
            return (
                f"unhealthy: {last}, older than {self.max_age:g}s: neither beat nor a worker "
                "sweeps (`harness sweep` sweeps once)"
            )
        if self.kind != SweepKind.WORKER.value:
            return f"healthy: {last}"
        quiet = "recorded" if self.beat_age is None else f"for {self.beat_age:.0f}s"
        return (
            f"healthy: {last}, in beat's place (no beat sweep {quiet}: is `celery beat` running?)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "max_age": self.max_age,
            "last_sweep_age_s": self.age,
            "last_sweep_kind": self.kind,
            "last_sweep_worker": self.worker,
            "beat_sweep_age_s": self.beat_age,
            "sweep_interval_seconds": self.interval,
        }


def sweeps_max_age(interval: float) -> float:
    """The default ``--max-age`` of the sweeps: a worker takes the sweep over
    after :data:`recovery.STALE` intervals with no beat sweep, and sweeps
    within one more."""
    return (recovery.STALE + 1) * interval


def check_sweeps(store: Sweeps, interval: float, max_age: float, now: float) -> SweepHealth:
    """Healthy when the store recorded a sweep that began within ``max_age`` s.
    Raises :class:`~harness.errors.StoreError` if the store does not answer."""
    last = store.last_sweep()
    beat = store.last_sweep(SCHEDULED_SWEEPS)
    age = None if last is None else max(0.0, now - last.started_at)
    return SweepHealth(
        healthy=age is not None and age <= max_age,
        max_age=max_age,
        age=age,
        kind=None if last is None else last.kind.value,
        worker=None if last is None else last.worker,
        beat_age=None if beat is None else max(0.0, now - beat.started_at),
        interval=interval,
    )


def bootstep(settings: Callable[[], Settings]) -> type[Heartbeat]:
    """The :class:`Heartbeat` of a worker whose settings ``settings()`` gives."""
    return type("Heartbeat", (Heartbeat,), {"settings": staticmethod(settings)})
