"""Retention: ``harness prune --older-than AGE [--status S] [--dry-run]``.

Deletes finished runs (completed, failed, cancelled, diverged) untouched for AGE, with
their steps, events and tool records. Why it is safe next to live workers:

- **Only terminal runs.** No worker writes a finished run, so the rows a
  prune deletes are rows nobody else is writing; the delete re-checks status
  and age in its WHERE all the same. A run still moving, waiting or paused is
  never touched, however old.
- **Short batches.** Each batch (``batch_size`` runs, 100 by default) is its
  own transaction: run rows, then their tool records, events and steps, each
  found on an index. On SQLite the write lock is held for one batch, then
  workers' checkpoints go first; on PostgreSQL deleting rows blocks no reader
  and locks only rows no worker wants.
- **Fork lineage.** A run that is a fork ancestor (parent, grandparent...)
  of a run that is kept is kept too, so every kept run's ``forked_from``
  still names a run that exists. A run is pruned only if its whole fork
  subtree is, and a batch deletes the forks of its runs with them. The
  delete also refuses a run that gained a kept fork child since its batch was
  chosen, and a batch whose delete would leave a kept run's ``forked_from``
  naming a deleted run (a fork made meanwhile, at any depth) is rolled back
  and tried again with its lineage read afresh; after ``TRIES`` such races it
  is left for the next prune (``skipped``).

Age is measured from the run's last update (``updated_at``), so a run
finished yesterday after a month of waiting for approval is not old.
Candidates are found oldest first on the index (created_at, run_id): a run
updated before the cutoff was created before it (there is no index on
``updated_at``, which every checkpoint changes). A dry run walks the same
batches and counts instead of deleting.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.errors import BadRetention
from harness.records import JSON, Run, RunStatus
from harness.store import Retention, RowCounts

#: Runs per batch, each batch one transaction.
BATCH_SIZE = 100
#: Attempts at a batch that keeps losing races with new forks of its runs.
TRIES = 3
TERMINAL = tuple(s for s in RunStatus if s.terminal)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s`` (or ``2w``) in seconds."""
    match = _AGE.fullmatch(text.strip().lower())
    if match is None:
        raise BadRetention(
            f"cannot read the age {text!r}: give a number and a unit, as in 30d, 12h, 90m or 3600s"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def statuses_for(status: RunStatus | str | None) -> tuple[RunStatus, ...]:
    """The statuses a prune may delete: every terminal one, or the one named."""
    if status is None:
        return TERMINAL
    try:
        chosen = RunStatus(status)
    except ValueError:
        chosen = None
    if chosen not in TERMINAL:
        names = ", ".join(s.value for s in TERMINAL)
        raise BadRetention(f"only finished runs are pruned: --status must be one of {names}")
    return (chosen,)


@dataclass(frozen=True)
class PruneReport:
    """What a prune deleted (or, dry, would delete), and how long it took."""

    dry_run: bool
    cutoff: float
    statuses: tuple[RunStatus, ...]
    runs: dict[str, int]  # by status
    rows: RowCounts
    ancestors_kept: int
    batches: int
    seconds: float
    #: The longest batch, in seconds: about the longest any lock was held.
    longest_batch: float = 0.0
    #: Runs of batches given up on after ``TRIES`` races with new forks.
    skipped: int = 0

    @property
    def run_count(self) -> int:
        return sum(self.runs.values())

    @property
    def row_count(self) -> int:
        """Every row: runs, steps, events and tool records."""
        return self.run_count + self.rows.steps + self.rows.events + self.rows.tool_records

    def to_dict(self) -> dict[str, JSON]:
        return {
            "dry_run": self.dry_run,
            "cutoff": self.cutoff,
            "statuses": [s.value for s in self.statuses],
            "runs": self.run_count,
            "runs_by_status": dict(sorted(self.runs.items())),
            "steps": self.rows.steps,
            "events": self.rows.events,
            "tool_records": self.rows.tool_records,
            "ancestors_kept": self.ancestors_kept,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "longest_batch_seconds": round(self.longest_batch, 4),
            "skipped": self.skipped,
        }


def prune(
    store: Retention,
    older_than: float,
    now: float,
    status: RunStatus | str | None = None,
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    timer: Callable[[], float] = time.perf_counter,
) -> PruneReport:
    """Delete (or count, ``dry_run``) the finished runs of ``status`` (every
    terminal one if None) last updated ``older_than`` seconds before ``now``,
    in batches of ``batch_size`` runs."""
    if older_than < 0:
        raise BadRetention("the age must not be negative")
    if batch_size < 1:
        raise BadRetention(f"the batch size must be positive, not {batch_size}")
    statuses = statuses_for(status)
    cutoff = now - older_than
    started = timer()
    tally = _Tally()
    after: tuple[float, str] | None = None
    while True:
        batch = store.prune_candidates(cutoff, statuses, batch_size, after)
        if not batch:
            break
        tally.batches += 1
        after = (batch[-1].created_at, batch[-1].run_id)
        _prune_batch(store, batch, cutoff, statuses, dry_run, timer, tally)
        if len(batch) < batch_size:
            break
    return PruneReport(
        dry_run,
        cutoff,
        statuses,
        dict(tally.runs),
        tally.rows,
        tally.kept,
        tally.batches,
        timer() - started,
        tally.longest,
        tally.skipped,
    )


@dataclass
class _Tally:
    """What a prune has done so far, batch by batch."""

    runs: Counter[str] = field(default_factory=Counter)
    rows: RowCounts = field(default_factory=RowCounts)
    kept: int = 0
    batches: int = 0
    skipped: int = 0
    longest: float = 0.0


def _prune_batch(
    store: Retention,
    batch: Sequence[Run],
    cutoff: float,
    statuses: tuple[RunStatus, ...],
    dry_run: bool,
    timer: Callable[[], float],
    tally: _Tally,
) -> None:
    """Delete (or count) one batch, keeping the runs forks depend on; tried
    again while forks of its runs are made meanwhile."""
    for attempt in range(1, TRIES + 1):
        protected = store.fork_protected([r.run_id for r in batch], cutoff, statuses)
        doomed = [r for r in batch if r.run_id not in protected]
        begun = timer()
        if dry_run:
            tally.runs.update(r.status.value for r in doomed)
            tally.rows += store.count_run_rows([r.run_id for r in doomed])
        else:
            deleted = store.delete_runs([r.run_id for r in doomed], cutoff, statuses)
            tally.runs.update(s.value for _, s in deleted.runs)
            tally.rows += deleted.rows
        tally.longest = max(tally.longest, timer() - begun)
        if dry_run or not deleted.kept_children:
            tally.kept += len(protected)
            return
        # Rolled back: forks of these runs were made meanwhile; their
        # lineage is committed now, so the next attempt keeps it.
        if attempt == TRIES:
            tally.skipped += len(batch)


def describe(report: PruneReport) -> list[str]:
    """The report as lines for a terminal."""
    verb = "would delete" if report.dry_run else "deleted"
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(report.runs.items())) or "none"
    lines = [
        f"{verb} {report.run_count} run(s) ({by_status}) "
        f"with {report.rows.steps} steps, {report.rows.events} events, "
        f"{report.rows.tool_records} tool records",
        f"kept {report.ancestors_kept} run(s) that are fork ancestors of runs kept",
    ]
    if report.skipped:
        lines.append(
            f"skipped {report.skipped} run(s): forks of them kept being made while "
            "they were pruned; the next prune tries again"
        )
    if not report.dry_run:
        rate = report.run_count / report.seconds if report.seconds > 0 else 0.0
        lines.append(
            f"{report.batches} batch(es) in {report.seconds:.2f}s "
            f"({rate:,.0f} runs/s, {report.row_count:,} rows; "
            f"longest batch {report.longest_batch * 1000:.0f} ms)"
        )
    return lines
