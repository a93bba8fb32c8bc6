"""Time, injectable: the wall clock in production, a hand-moved one in tests.

At the bottom of the library because lease logic (harness.engine.leases),
the agent catalog and the read service all take one, and none of them should
import another to get it.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, comparable across workers."""

    def sleep(self, seconds: float) -> None:
        """Wait (a test clock just moves on)."""


class SystemClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
