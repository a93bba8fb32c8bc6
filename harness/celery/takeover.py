"""Workers take the sweep over while beat does not sweep.

Recovery runs on a periodic sweep (harness.engine.recovery), and beat is the
process that runs it. Forget to start beat, or lose it, and a run whose
worker died sits ``running`` under a dead owner for ever. So every worker
watches the sweeps recorded in the store, from a thread of its main process
(not a pool child: it holds no pool slot and never delays a step):

* every ``HARNESS_SWEEP_INTERVAL`` it reads when beat last swept (a sweep of
  a scheduled kind: beat's own, or a ``tasks.sweep`` message's);
* once beat has not swept for :data:`STALE` intervals, and the worker itself
  has been up that long (beat may be starting beside it), it tries the
  sweep lease, one row of the store taken by compare-and-set. The worker
  that holds it sweeps each interval, renewing it each time, and says so
  once in its log, at WARNING; the others keep watching. Should the holder
  die, its lease lapses after :data:`STALE` intervals and another worker
  takes it;
* once beat's sweeps are recorded again, the holder gives the lease up and
  stops, and says so.

So with no beat at all, a worker sweeps within ``(STALE + 1)`` sweep
intervals of starting, and recovery then takes lease TTL + sweep interval
as with beat. A worker's sweeps are recorded as kind ``worker``, by its
node name and pid. ``harness sweep`` by hand is no schedule: it does not
stand the workers down. The store being down is logged, and the next tick
tries again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from celery import bootsteps

from harness.celery import sweeper
from harness.clock import SystemClock
from harness.engine import recovery
from harness.engine.executor import NoCache
from harness.engine.runtime import Runtime, Sender
from harness.errors import HarnessError
from harness.settings import Settings
from harness.store import SCHEDULED_SWEEPS, Sweep, SweepKind
from harness.store.opening import open_store

log = logging.getLogger(__name__)

#: Sweep intervals without a sweep by beat before a worker takes the sweep over;
#: also the life of the sweep lease, renewed at each of its holder's sweeps.
STALE = recovery.STALE
#: Seconds a stopping worker waits for a sweep under way to end.
STOP_WAIT = 10.0


class Takeover:
    """One worker's watch over the sweeps, a tick at a time (:meth:`tick`).

    ``rt``: the runtime the worker sweeps with; its ``worker_id`` names the
    worker in the lease and in the sweeps it records. ``sweep``: one sweep of
    kind ``worker`` on a runtime, returning how many runs it re-sent.
    """

    def __init__(
        self,
        rt: Runtime,
        interval: float,
        sweep: Callable[[Runtime], int] | None = None,
    ) -> None:
        self.rt = rt
        self.interval = interval
        self.started = rt.clock.now()
        self.sweeping = False
        self._sweep = sweep or (lambda on: sweeper.sweep(on, SweepKind.WORKER))

    @property
    def stale_after(self) -> float:
        """Seconds without a sweep by beat after which a worker sweeps."""
        return STALE * self.interval

    def tick(self) -> bool:
        """Sweep now if this worker should; True if it did. Raises
        :class:`~harness.errors.StoreError` when the store does not answer."""
        now = self.rt.clock.now()
        beat = self.rt.store.last_sweep(SCHEDULED_SWEEPS)
        if now - self.started < self.stale_after or _recent(beat, now, self.stale_after):
            if self.sweeping:
                self.stand_down(beat, now)
            return False
        holder = self.rt.worker_id
        if not self.rt.store.take_sweep_lease(holder, now, now + self.stale_after):
            if self.sweeping:
                log.warning("another worker holds the sweep lease: this worker stops sweeping")
                self.sweeping = False
            return False
        if not self.sweeping:
            log.warning(
                "%s (is `celery beat` running?): this worker sweeps until one is", _quiet(beat, now)
            )
            self.sweeping = True
        self._sweep(self.rt)
        return True

    def stand_down(self, beat: Sweep | None, now: float) -> None:
        """Give the lease up (beat sweeps again, or this worker stops)."""
        self.sweeping = False
        self.rt.store.release_sweep_lease(self.rt.worker_id)
        if beat is not None and now - beat.started_at < self.stale_after:
            log.warning(
                "beat swept %.1fs ago: this worker stops sweeping", max(0.0, now - beat.started_at)
            )

    def watch(self, stop: threading.Event) -> None:
        """Tick every interval until ``stop`` is set; never raises."""
        while not stop.wait(self.interval):
            self.safe_tick()

    def safe_tick(self) -> None:
        """:meth:`tick`, its failures logged: the next tick tries again."""
        try:
            self.tick()
        except HarnessError as err:  # the store is down, say: a sweep is missed, not the worker
            log.warning("sweep watch: %s; trying again in %gs", err, self.interval)
        except Exception:
            log.exception("sweep watch failed; trying again in %gs", self.interval)


def _recent(sweep: Sweep | None, now: float, within: float) -> bool:
    return sweep is not None and now - sweep.started_at < within


def _quiet(beat: Sweep | None, now: float) -> str:
    if beat is None:
        return "no sweep recorded"
    return f"no sweep for {max(0.0, now - beat.started_at):.0f}s"


def worker_runtime(settings: Settings, name: str, sender: Sender) -> Runtime:
    """A runtime for a worker's sweeps: a store of its own (its connections
    are never shared with the pool's children), and the app's sender."""
    return Runtime(
        open_store(settings),
        NoCache(),
        SystemClock(),
        name,
        settings.lease_ttl,
        sender,
        probes=settings.delivery_probes,
    )


class SweepWatch(bootsteps.StartStopStep):
    """Worker bootstep: a thread of the worker's main process runs
    :class:`Takeover`. Add it with ``app.steps["worker"].add(bootstep(...))``
    (:func:`bootstep` binds the app's sender)."""

    requires = ("celery.worker.components:Pool",)
    #: Builds the sender of the app's step messages for the settings.
    make_sender: ClassVar[Callable[[Settings], Sender]]
    #: The worker's settings, as its composition root reads them (harness.celery).
    settings: ClassVar[Callable[[], Settings]]

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._takeover: Takeover | None = None

    def start(self, parent: Any) -> None:
        settings = type(self).settings()
        name = f"{parent.hostname}:{os.getpid()}"
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(settings, name), name="harness-sweep-watch", daemon=True
        )
        self._thread.start()

    def _run(self, settings: Settings, name: str) -> None:
        # The store may be down at start: build the runtime at the first tick that can.
        while self._takeover is None:
            try:
                rt = worker_runtime(settings, name, type(self).make_sender(settings))
            except HarnessError as err:
                log.warning("sweep watch: %s; trying again in %gs", err, settings.sweep_interval)
            except Exception:  # the thread must not die: it is the worker's recovery
                log.exception("sweep watch failed; trying again in %gs", settings.sweep_interval)
            else:
                with self._lock:  # a stop that came meanwhile closes nothing of ours
                    if self._stop.is_set():
                        rt.store.close()
                        return
                    self._takeover = Takeover(rt, settings.sweep_interval)
                break
            if self._stop.wait(settings.sweep_interval):
                return
        self._takeover.watch(self._stop)

    def terminate(self, parent: Any) -> None:
        self._stop.set()  # a cold shutdown waits for nothing: the lease lapses by itself

    def stop(self, parent: Any) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(STOP_WAIT)
            if thread.is_alive():  # a sweep under way: its store is not ours to close
                log.warning("sweep watch still sweeping at stop: its lease lapses by itself")
                return
        with self._lock:
            takeover, self._takeover = self._takeover, None
        if takeover is None:
            return
        if takeover.sweeping:
            try:
                takeover.stand_down(None, takeover.rt.clock.now())
            except HarnessError as err:  # it lapses by itself
                log.warning("sweep lease not given up: %s", err)
        takeover.rt.store.close()


def bootstep(
    sender: Callable[[Settings], Sender], settings: Callable[[], Settings]
) -> type[SweepWatch]:
    """The :class:`SweepWatch` of an app whose step messages ``sender`` sends,
    in a worker whose settings ``settings()`` gives."""
    attributes = {"make_sender": staticmethod(sender), "settings": staticmethod(settings)}
    return type("SweepWatch", (SweepWatch,), attributes)
