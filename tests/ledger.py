"""An external ledger of side effects, written by tools and read by tests.

Each line is ``<kind> <key> <pid> <time>``, appended with O_APPEND in one
write so concurrent writers from several processes never interleave. A
``start`` line is written when a call begins, an ``end`` line when its effect
is done.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def append(path: str, kind: str, key: str) -> None:
    line = f"{kind} {key} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Execution:
    """One call of a tool for a key, by one process."""

    key: str
    pid: int
    start: float
    end: float | None  # None: the call never finished (killed, or still running)


class Ledger:
    def __init__(self, executions: list[Execution]) -> None:
        self.executions = executions
        self.by_key: dict[str, list[Execution]] = defaultdict(list)
        for e in sorted(executions, key=lambda e: e.start):
            self.by_key[e.key].append(e)

    @classmethod
    def read(cls, path: Path) -> Ledger:
        starts: list[tuple[str, int, float]] = []
        ends: dict[tuple[str, int], list[float]] = defaultdict(list)
        if path.exists():
            for line in path.read_text().splitlines():
                kind, key, pid, at = line.split()
                if kind == "start":
                    starts.append((key, int(pid), float(at)))
                else:
                    ends[key, int(pid)].append(float(at))
        executions = []
        for key, pid, start in sorted(starts, key=lambda s: s[2]):
            # a process runs one call at a time: its next end after this start is this call's
            later = sorted(t for t in ends[key, pid] if t >= start)
            end = later[0] if later else None
            if later:
                ends[key, pid].remove(end)  # type: ignore[arg-type]
            executions.append(Execution(key, pid, start, end))
        return cls(executions)

    def calls(self, key: str) -> int:
        return len(self.by_key.get(key, []))

    def effects(self, key: str) -> int:
        return sum(e.end is not None for e in self.by_key.get(key, []))

    def unfinished(self, killed: Kills) -> dict[str, int]:
        """Calls still under way: no end, and their process not killed since. {key: pid}"""
        return {
            e.key: e.pid
            for e in self.executions
            if e.end is None and killed_after(killed, e.pid, e.start) is None
        }

    def unjustified_repeats(self, killed: Kills) -> list[str]:
        """Keys called again although the previous call's process was not killed
        between that call's start and the next one."""
        bad = []
        for key, calls in self.by_key.items():
            for a, b in itertools.pairwise(calls):
                kill = killed_after(killed, a.pid, a.start)
                if kill is None or kill > b.start:
                    bad.append(key)
        return bad

    def overlapping(self, killed: Kills) -> list[str]:
        """Keys with two calls under way at once. A call with no end lasted until its
        process was killed, or, if it was not, is still under way."""
        bad = []
        for key, calls in self.by_key.items():
            latest_end = -math.inf
            for e in calls:  # sorted by start
                if e.start < latest_end:
                    bad.append(key)
                    break
                end = e.end if e.end is not None else killed_after(killed, e.pid, e.start)
                latest_end = max(latest_end, math.inf if end is None else end)
        return bad


#: When each pid was SIGKILLed. Pids are reused (pid_max is 32768 here), so one
#: pid may have been killed several times, as different processes.
Kills = Mapping[int, Sequence[float]]


def killed_after(killed: Kills, pid: int, start: float) -> float | None:
    """The first kill of ``pid`` at or after ``start``: the end of a call it began then."""
    return min((t for t in killed.get(pid, ()) if t >= start), default=None)
