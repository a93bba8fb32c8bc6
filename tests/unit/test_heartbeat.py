"""The heartbeat: one thread per process beats every lease in use, on time."""

from __future__ import annotations

import threading
import time

from harness.engine.leases import Heartbeat


class FakeLease:
    """Counts renewals; can hold one in flight, or say the lease is gone."""

    def __init__(self, ttl: float, alive_for: int = 1_000) -> None:
        self.ttl = ttl
        self.run_id = "r"
        self.renewals = 0
        self.alive_for = alive_for
        self.lost = False
        self.expired = False  # past the step time limit
        self.in_flight = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def renew(self) -> bool:
        if self.lost:
            return False
        self.in_flight.set()
        self.release.wait(5)
        self.renewals += 1
        self.in_flight.clear()
        self.lost = self.renewals >= self.alive_for
        return not self.lost

    def past_deadline(self) -> bool:
        return self.expired


def _beat(lease: FakeLease, also: list[int] | None = None) -> Heartbeat:
    return Heartbeat(lease, also=(lambda: also.append(1)) if also is not None else lambda: None)  # type: ignore[arg-type]


def wait_for(check: object, timeout: float = 5.0) -> None:
    """Wait for a condition; a generous bound, so a hung heartbeat fails the test."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never held")
        time.sleep(0.005)


def test_beats_every_third_of_the_ttl_and_stops_at_exit() -> None:
    lease, also = FakeLease(ttl=0.15), []
    with _beat(lease, also):
        wait_for(lambda: lease.renewals >= 3)
    stopped_at = lease.renewals
    time.sleep(0.2)
    assert lease.renewals == stopped_at
    assert len(also) == stopped_at  # the tied renewal follows each beat


def test_a_short_block_is_never_beaten() -> None:
    lease = FakeLease(ttl=30)
    for _ in range(100):
        with _beat(lease):
            pass
    assert lease.renewals == 0


def test_several_leases_are_beaten_by_one_thread() -> None:
    leases = [FakeLease(ttl=0.15) for _ in range(3)]
    before = {t.name for t in threading.enumerate()}
    beats = [_beat(lease) for lease in leases]
    for beat in beats:
        beat.__enter__()
    try:
        wait_for(lambda: all(lease.renewals >= 2 for lease in leases))
        assert sum(t.name == "heartbeat" for t in threading.enumerate()) <= 1 + (
            "heartbeat" in before
        )
    finally:
        for beat in beats:
            beat.__exit__(None, None, None)


def test_exit_waits_for_a_renewal_in_flight() -> None:
    """The step's result checkpoint must see the lease's final version."""
    lease = FakeLease(ttl=0.06)
    lease.release.clear()
    beat = _beat(lease).__enter__()
    wait_for(lease.in_flight.is_set)
    exited = threading.Event()
    leaving = threading.Thread(target=lambda: (beat.__exit__(None, None, None), exited.set()))
    leaving.start()
    assert not exited.wait(0.1)  # held while the renewal runs
    lease.release.set()
    assert exited.wait(5)
    leaving.join()
    assert lease.renewals == 1


def test_a_lost_lease_is_no_longer_renewed_but_the_call_keeps_its_claim() -> None:
    """Taken over mid-call: the lease is not renewed, but the call in flight keeps
    its idempotency claim alive, so the new owner waits for it instead of calling
    again; past the step time limit everything lapses."""
    lease, also = FakeLease(ttl=0.06, alive_for=2), []
    with _beat(lease, also):
        wait_for(lambda: lease.renewals == 2)
        wait_for(lambda: len(also) >= 4)
        assert lease.renewals == 2
        lease.expired = True
        time.sleep(0.05)
        stopped_at = len(also)
        time.sleep(0.1)
        assert len(also) == stopped_at
