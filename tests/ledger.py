"""An external ledger of side effects, written by tools and read by tests.

Each line is ``<kind> <key> <pid> <time>``, appended with O_APPEND in one
write so concurrent writers from several processes never interleave.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


def append(path: str, kind: str, key: str) -> None:
    line = f"{kind} {key} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Ledger:
    starts: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    ends: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def read(cls, path: Path) -> Ledger:
        ledger = cls()
        if not path.exists():
            return ledger
        for line in path.read_text().splitlines():
            kind, key, pid, at = line.split()
            target = ledger.starts if kind == "start" else ledger.ends
            target[key].append((int(pid), float(at)))
        return ledger

    def effects(self, key: str) -> int:
        return len(self.ends.get(key, []))

    def overlapping(self) -> list[str]:
        """Keys where one execution started before another (of another pid) ended."""
        bad = []
        for key, starts in self.starts.items():
            intervals = []
            for pid, start in starts:
                end = min(
                    (t for p, t in self.ends.get(key, []) if p == pid and t >= start), default=None
                )
                intervals.append((start, end if end is not None else start, pid))
            intervals.sort()
            for (_, end_a, pid_a), (start_b, _, pid_b) in itertools.pairwise(intervals):
                # an execution with no end was killed; its interval ends at its start
                if pid_a != pid_b and start_b < end_a:
                    bad.append(key)
        return bad
