"""Leases: one owner per run, renewed while a step runs.

A lease is the owner id and an expiry on the run row, written by CAS. The
heartbeat renews it every third of the TTL, again by CAS, so the version it
holds is the fencing token: once another worker takes the run over, the
next renewal (and the step's result checkpoint) matches no row and fails.
A renewal bumps the version but writes no event: it is not a transition.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from harness import faults
from harness.clock import Clock
from harness.engine import transitions
from harness.errors import StaleWriteError, StoreError
from harness.store import Store

log = logging.getLogger(__name__)
T = TypeVar("T")


class Lease:
    """A lease held on one run; its ``version`` moves with every renewal.

    Past ``deadline`` (the step time limit) it is no longer renewed and lapses,
    so a hung step cannot hold its run forever where Celery cannot kill it.
    A lease made with ``claimed=False`` is not written yet (a step safe to run
    twice went straight to execution): its first renewal writes it, by the
    same CAS, so a long step still keeps other workers and the sweeper away.
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
        claimed: bool = True,
        started_at: float | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.run_id = run_id
        #: This execution of the step (``worker/nonce``, one per execution): the
        #: owner of the lease and of the step's idempotency claim.
        self.owner = owner
        self.ttl = ttl
        self.deadline = deadline
        self.crash = crash
        self.kind = kind
        #: Written to the store before the step executed (its RUNNING checkpoint).
        self.claimed_before_execution = claimed
        #: In the store now: claimed before execution, or by a renewal since.
        self.written = claimed
        self.started_at = started_at
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

    def seems_valid(self) -> bool:
        """:meth:`valid` as the last renewal left it, without waiting for one
        in flight (a store write): for a caller that must never wait on it."""
        return not self.lost and self.clock.now() < self._expires_at

    def past_deadline(self) -> bool:
        """The step has run longer than its time limit."""
        return self.deadline is not None and self.clock.now() > self.deadline

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
            checkpoint = transitions.renew(
                self.run_id, self._version, worker=self.owner, now=now, ttl=self.ttl
            )
            try:
                self._version = self.store.checkpoint(checkpoint)
                self._expires_at = now + self.ttl
                self.written = True
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


def write_while_held(lease: Lease, work: Callable[[], T], what: str) -> T:
    """The retry policy of a write the step's outcome depends on: a store
    failure (a database restart) is retried with backoff for as long as the
    lease holds, and at most one TTL; after that the run belongs to whoever
    recovers it and the failure is raised. A stale write is never retried."""
    clock = lease.clock
    delay = 0.1
    give_up = clock.now() + lease.ttl  # a store that stays broken is not waited out
    while True:
        try:
            return work()
        except StaleWriteError:
            raise  # fenced: the run is someone else's now
        except StoreError as err:
            if not lease.valid() or clock.now() > give_up:
                raise
            log.warning(
                "run=%s could not write %s (%s); retrying in %.1fs", lease.run_id, what, err, delay
            )
            clock.sleep(delay)
            delay = min(delay * 2, 2.0)


class Heartbeat:
    """Renews a lease, then anything tied to it, every third of its TTL while the
    block runs. The beats come from one background thread per process: starting
    a thread for every step cost about as much as one of its database writes."""

    def __init__(self, lease: Lease, also: Callable[[], None] = lambda: None) -> None:
        self.lease = lease
        self.also = also
        self.interval = lease.ttl / 3

    def __enter__(self) -> Heartbeat:
        _keeper().add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # Waits out a beat in flight: once the block is left, the lease's
        # version is final for the step's result checkpoint.
        _keeper().remove(self)

    def beat(self) -> bool:
        """One renewal of the lease, then of what is tied to the call in flight;
        False once the step is past its time limit.

        A lease lost to a takeover is not renewed, but the rest still is: the
        call under way keeps its idempotency claim, so the new owner waits for
        its result (kept on the way out) instead of calling the tool again
        while this call still runs. Past the time limit everything lapses.
        """
        self.lease.renew()
        if self.lease.past_deadline():
            return False
        try:
            self.also()
        except Exception as err:
            log.warning("run=%s heartbeat side task failed: %s", self.lease.run_id, err)
        return True


class _Keeper:
    """The process's heartbeat thread: beats each registered heartbeat when due.

    ``clock`` (seconds, monotonic) says when a beat is due; a test gives one it moves
    by hand, then calls :meth:`wake` so the thread looks at the time again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._due: dict[Heartbeat, float] = {}
        self._beating: Heartbeat | None = None
        self._thread: threading.Thread | None = None
        self._wakes_at: float | None = None  # when the thread wakes; None: when notified

    def add(self, heartbeat: Heartbeat) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
                self._thread.start()
            due = self._clock() + heartbeat.interval
            self._due[heartbeat] = due
            # Wake the thread only if it would sleep past this beat: most steps end
            # long before their first beat, and a wake-up per step costs a switch.
            if self._wakes_at is None or due < self._wakes_at:
                self._cond.notify_all()

    def wake(self) -> None:
        """Have the thread read the clock again (it sleeps until the first beat is due)."""
        with self._cond:
            self._cond.notify_all()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._cond:
            self._due.pop(heartbeat, None)
            while self._beating is heartbeat:
                self._cond.wait()

    def _next(self) -> Heartbeat:
        """Wait for the first due heartbeat and mark it as beating."""
        while True:
            now = self._clock()
            first = min(self._due.items(), key=lambda item: item[1], default=None)
            if first is not None and first[1] <= now:
                heartbeat = first[0]
                self._due[heartbeat] = now + heartbeat.interval
                self._beating = heartbeat
                return heartbeat
            self._wakes_at = None if first is None else first[1]
            self._cond.wait(None if first is None else first[1] - now)

    def _run(self) -> None:
        while True:
            with self._cond:
                heartbeat = self._next()
            alive = False
            try:
                alive = heartbeat.beat()
            finally:
                with self._cond:
                    self._beating = None
                    if not alive:
                        self._due.pop(heartbeat, None)
                    self._cond.notify_all()


_current = _Keeper()


def _keeper() -> _Keeper:
    return _current


def _after_fork() -> None:
    # A forked child (a prefork pool process) has no heartbeat thread: start afresh.
    global _current
    _current = _Keeper()


os.register_at_fork(after_in_child=_after_fork)
