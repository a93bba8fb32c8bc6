"""The heartbeat: one thread per process beats every lease in use, on time.

The beats are timed by a clock the test moves by hand (the keeper's ``clock``), and
"nothing more happened" is read after :meth:`HandKeeper.caught_up`, not after a sleep:
the keeper beats what is due in the order it fell due, so once a marker due at the
current time has been beaten, every beat due by then has been made.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from harness.engine import leases
from harness.engine.leases import Heartbeat
from tests.rig import FakeClock

TIMEOUT = 5.0  # seconds; only reached when the keeper is hung


class FakeLease:
    """Counts renewals; can hold one in flight, or say the lease is gone."""

    def __init__(self, ttl: float, alive_for: int = 1_000) -> None:
        self.ttl = ttl
        self.run_id = "r"
        self.renewals = 0
        self.attempts = 0  # renewals asked for, the refused ones of a lost lease too
        self.alive_for = alive_for
        self.lost = False
        self.expired = False  # past the step time limit
        self.in_flight = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.asked = threading.Condition()

    def renew(self) -> bool:
        try:
            if self.lost:
                return False
            self.in_flight.set()
            self.release.wait(TIMEOUT)
            self.renewals += 1
            self.in_flight.clear()
            self.lost = self.renewals >= self.alive_for
            return not self.lost
        finally:
            with self.asked:
                self.attempts += 1
                self.asked.notify_all()

    def past_deadline(self) -> bool:
        return self.expired

    def wait_attempts(self, count: int) -> None:
        with self.asked:
            assert self.asked.wait_for(lambda: self.attempts >= count, TIMEOUT), "never beaten"


class HandKeeper:
    """A heartbeat keeper of the test's own, on a clock moved by hand."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.keeper = leases._Keeper(self.clock.now)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.keeper.wake()

    def caught_up(self) -> None:
        """Return once every beat due by now has been made (see the module docstring)."""
        marker = FakeLease(ttl=0.0)  # due at once
        marker.expired = True  # beaten once, then dropped
        with Heartbeat(marker):  # type: ignore[arg-type]
            self.keeper.wake()
            marker.wait_attempts(1)


@pytest.fixture
def hand() -> Iterator[HandKeeper]:
    """Heartbeats entered in the test are beaten by a keeper on a hand-moved clock."""
    keeper = HandKeeper()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(leases, "_current", keeper.keeper)
        yield keeper


def _beat(lease: FakeLease, also: list[int] | None = None) -> Heartbeat:
    return Heartbeat(lease, also=(lambda: also.append(1)) if also is not None else lambda: None)  # type: ignore[arg-type]


def test_beats_every_third_of_the_ttl_and_stops_at_exit(hand: HandKeeper) -> None:
    lease, also = FakeLease(ttl=0.75), []
    with _beat(lease, also):  # a beat every 0.25 s
        hand.advance(0.1875)
        hand.caught_up()
        assert lease.renewals == 0  # not before a third of the TTL
        hand.advance(0.0625)
        lease.wait_attempts(1)
        hand.caught_up()
        assert (lease.renewals, len(also)) == (1, 1)  # the tied renewal follows each beat
        hand.advance(0.1875)
        hand.caught_up()
        assert lease.renewals == 1  # a third of the TTL after the last beat, not before
        hand.advance(0.0625)
        hand.caught_up()
        assert (lease.renewals, len(also)) == (2, 2)
    hand.advance(10.0)
    hand.caught_up()
    assert (lease.renewals, len(also)) == (2, 2)


def test_a_short_block_is_never_beaten(hand: HandKeeper) -> None:
    lease = FakeLease(ttl=30)
    for _ in range(100):
        with _beat(lease):
            hand.advance(0.05)
    hand.advance(60.0)  # long after: nothing of the blocks left is beaten
    hand.caught_up()
    assert lease.attempts == 0


def test_several_leases_are_beaten_by_one_thread(hand: HandKeeper) -> None:
    leases_ = [FakeLease(ttl=0.75) for _ in range(3)]
    before = sum(t.name == "heartbeat" for t in threading.enumerate())
    beats = [_beat(lease) for lease in leases_]
    for beat in beats:
        beat.__enter__()
    try:
        hand.advance(0.25)
        hand.caught_up()
        hand.advance(0.25)
        hand.caught_up()
        assert [lease.renewals for lease in leases_] == [2, 2, 2]
        assert sum(t.name == "heartbeat" for t in threading.enumerate()) == before + 1
    finally:
        for beat in beats:
            beat.__exit__(None, None, None)


class WatchedCondition(threading.Condition):
    """Says when a thread other than the keeper's waits on the keeper's condition."""

    def __init__(self) -> None:
        super().__init__()
        self.outsider_waits = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if threading.current_thread().name != "heartbeat":
            self.outsider_waits.set()
        return super().wait(timeout)


def test_exit_waits_for_a_renewal_in_flight(hand: HandKeeper) -> None:
    """The step's result checkpoint must see the lease's final version."""
    watched = hand.keeper._cond = WatchedCondition()
    lease = FakeLease(ttl=0.75)
    lease.release.clear()
    beat = _beat(lease).__enter__()
    hand.advance(0.25)
    assert lease.in_flight.wait(TIMEOUT)
    exited = threading.Event()
    leaving = threading.Thread(target=lambda: (beat.__exit__(None, None, None), exited.set()))
    leaving.start()
    assert watched.outsider_waits.wait(TIMEOUT)  # the exit waits for the beat...
    assert not exited.is_set() and lease.renewals == 0
    lease.release.set()
    assert exited.wait(TIMEOUT)  # ...and leaves once it is made
    leaving.join()
    assert lease.renewals == 1


def test_a_lost_lease_is_no_longer_renewed_but_the_call_keeps_its_claim(
    hand: HandKeeper,
) -> None:
    """Taken over mid-call: the lease is not renewed, but the call in flight keeps
    its idempotency claim alive, so the new owner waits for it instead of calling
    again; past the step time limit everything lapses."""
    lease, also = FakeLease(ttl=0.75, alive_for=2), []
    with _beat(lease, also):
        for _ in range(4):
            hand.advance(0.25)
            hand.caught_up()
        assert (lease.renewals, lease.attempts, len(also)) == (2, 4, 4)
        lease.expired = True
        hand.advance(0.25)
        hand.caught_up()
        assert (lease.attempts, len(also)) == (5, 4)  # asked once more, and nothing renewed
        hand.advance(10.0)
        hand.caught_up()
        assert (lease.attempts, len(also)) == (5, 4)  # and never again
