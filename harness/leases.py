"""Leases: one owner per run, renewed while a step runs.

A lease is the owner id and an expiry on the run row, written by CAS. The
heartbeat renews it every third of the TTL, again by CAS, so the version it
holds is the fencing token: once another worker takes the run over, the
next renewal (and the step's result checkpoint) matches no row and fails.
A renewal bumps the version but writes no event: it is not a transition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from harness import faults
from harness.errors import StaleWriteError, StoreError
from harness.store import Checkpoint, RunPatch, Store

log = logging.getLogger(__name__)
T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, comparable across workers."""


class SystemClock:
    def now(self) -> float:
        return time.time()


class Lease:
    """A lease held on one run; its ``version`` moves with every renewal.

    Past ``deadline`` (the step time limit) it is no longer renewed and lapses,
    so a hung step cannot hold its run forever where Celery cannot kill it.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        run_id: str,
        owner: str,
        version: int,
        ttl: float,
        expires_at: float,
        deadline: float | None = None,
        crash: faults.CrashPoints = faults.NEVER,
        kind: str = "",
    ) -> None:
        self.store = store
        self.clock = clock
        self.run_id = run_id
        self.owner = owner
        self.ttl = ttl
        self.deadline = deadline
        self.crash = crash
        self.kind = kind
        self._version = version
        # Exactly what the store holds: a slow claim commit must not make us
        # believe in a lease that has already lapsed there.
        self._expires_at = expires_at
        self._lock = threading.Lock()
        self.lost = False

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def valid(self) -> bool:
        """Still ours as far as we know: not taken over, not lapsed."""
        with self._lock:
            return not self.lost and self.clock.now() < self._expires_at

    def persist(self, work: Callable[[], T], what: str) -> T:
        """Run a write the step's outcome depends on, retrying a store failure (a
        database restart) with backoff for as long as the lease holds; after that
        the run belongs to whoever recovers it."""
        delay = 0.1
        give_up = time.monotonic() + self.ttl  # a store that stays broken is not waited out
        while True:
            try:
                return work()
            except StaleWriteError:
                raise  # fenced: the run is someone else's now
            except StoreError as err:
                if not self.valid() or time.monotonic() > give_up:
                    raise
                log.warning(
                    "run=%s could not write %s (%s); retrying in %.1fs",
                    self.run_id,
                    what,
                    err,
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def renew(self) -> bool:
        """Extend the lease; False once it is gone (taken over or past the deadline)."""
        with self._lock:
            if self.lost:
                return False
            now = self.clock.now()
            if self.deadline is not None and now > self.deadline:
                log.error(
                    "run=%s v=%d step exceeded its time limit: letting the lease lapse",
                    self.run_id,
                    self._version,
                )
                self.lost = True
                return False
            self.crash("during_lease_renewal", self.kind)
            checkpoint = Checkpoint(
                self.run_id,
                self._version,
                self.owner,
                now,
                run=RunPatch(lease_expires_at=now + self.ttl),
            )
            try:
                self._version = self.store.checkpoint(checkpoint)
                self._expires_at = now + self.ttl
            except StaleWriteError:
                self.lost = True
                log.warning(
                    "run=%s v=%d lease lost: another worker took the run over",
                    self.run_id,
                    self._version,
                )
                return False
            except Exception as err:  # keep beating: the database may come back in time
                log.warning(
                    "run=%s v=%d lease renewal failed, will retry: %s",
                    self.run_id,
                    self._version,
                    err,
                )
            return True


class Heartbeat:
    """Renews a lease, then anything tied to it, in a background thread."""

    def __init__(self, lease: Lease, also: Callable[[], None] = lambda: None) -> None:
        self.lease = lease
        self.also = also
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"heartbeat-{lease.run_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        interval = self.lease.ttl / 3
        while not self._stop.wait(interval):
            if not self.lease.renew():
                return
            try:
                self.also()
            except Exception as err:
                log.warning("run=%s heartbeat side task failed: %s", self.lease.run_id, err)
