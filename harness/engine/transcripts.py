"""A worker process's memory of the conversations it carries.

A model turn sends the provider the whole conversation, rebuilt from the
run's steps (harness.providers.transcript). Read and decoded whole every
turn, a conversation of 200 turns cost its turn 200 six times its turn 2
(bench.conversation). So a process keeps, per run it carried, the steps it
has read that can no longer change and the exchanges made of them, and a
turn reads only the steps after them: the turn before's last steps, the
user's message, its own model step. The store stays the truth: what is kept
is what the store said, and only what it can never say otherwise.

**What cannot change.** A step is written by its run's owner while it is
at the cursor, and the cursor only moves forward; behind it, only steps
still waiting are answered (a deferred call's answer, an in-doubt call's
resolution, an approval's word) and a model step with no result may get the
late charge of its call (harness.engine.billing). So a step is *settled*,
and kept, once it is behind the cursor the turn was claimed at, ``done`` or
``failed``, and, for a model step, has its result. Forks, replays and
imports make runs of their own, and whenever a store inserts a run row it
gives it a new incarnation (``Run.incarnation``, a nonce never exported):
a run pruned and made again, or imported again from an export (which keeps
its creation time, and may have as many steps, the last unchanged, with an
earlier one answered otherwise), is another incarnation.

**What is checked each turn**, before a kept step is used, with the run as
the turn's load or claim read it and in the one read of steps a turn makes
anyway (from the last kept one on): the run has the same incarnation and
creation time, at least as many steps as are kept, and the last kept step
reads as it was kept. If not (a run made again under the same id, a store
wiped), the run is read whole, as with nothing kept. A row made before
incarnations (migration 0017) has none: None is one value, and the other
checks are what they were. A takeover changes nothing kept: another worker
can only have appended steps, or answered steps that were not settled, and
both come with the read. What no check sees is a database restored from a
backup under running workers (the same incarnations, rolled back): stop or
restart the workers around a restore (docs/RELIABILITY.md).

**Bounds.** What a process keeps weighs :data:`MAX_WEIGHT` at most, a
step weighing the bytes of its arguments' and result's JSON and
:data:`STEP_WEIGHT` besides (a little over a quarter of the memory it takes,
decoded, with its exchange: 930 for 3.4 KB, on average, a step of
bench.conversation's support conversation, whose tool results are 1 KB);
the runs used least recently are forgotten first, and a conversation
heavier than the bound is read whole each turn, as before. The cache holds
only decoded rows, never a lease or a version: it decides nothing, it only
saves reading and decoding.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from harness.providers.transcript import Exchange, exchanges
from harness.records import Run, Step, StepKind, StepStatus
from harness.store import Store

#: What one process keeps at most, over all its runs, in bytes of JSON
#: (:func:`weight`): about 36 MB of memory, some 10,000 steps of conversations
#: whose tool results are 1 KB (a dozen conversations of 200 turns).
MAX_WEIGHT = 10_000_000
#: What a step weighs besides its arguments and result: its record, its exchange.
STEP_WEIGHT = 500


def weight(step: Step) -> int:
    """What keeping ``step`` costs, in bytes of the JSON of its arguments and
    result (see :data:`MAX_WEIGHT`): encoded by ``msgspec``, a few times
    faster than ``repr`` or ``json.dumps``, for a read of a whole run weighs
    every step."""
    try:
        text = len(_ENCODE(step.args)) + len(_ENCODE(step.result))
    except (msgspec.MsgspecError, TypeError, ValueError, OverflowError):  # not JSON: as printed
        text = len(repr(step.args)) + len(repr(step.result))
    return STEP_WEIGHT + text


_ENCODE = msgspec.json.Encoder().encode


def settled(step: Step, cursor: int | None) -> bool:
    """Can ``step``, of a run claimed at ``cursor``, no longer change?"""
    if cursor is None or step.index >= cursor:
        return False
    if step.status not in (StepStatus.DONE, StepStatus.FAILED):
        return False
    return step.kind is not StepKind.MODEL or step.result is not None


@dataclass(frozen=True)
class History:
    """A run's steps as one turn reads them: ``steps`` (every step, in order)
    and the count of them that are settled; ``memo``: the exchanges already
    made of settled steps, shared by every turn of the run in this process."""

    steps: list[Step]
    settled: int
    memo: dict[int, Exchange | None] = field(default_factory=dict)

    def exchanges(self, before: int) -> list[Exchange]:
        """The exchanges of the steps before ``before`` (as
        :func:`harness.providers.transcript.exchanges`), those of settled
        steps made once (not for a turn behind them, whose exchanges end sooner)."""
        if before < self.settled:
            return exchanges(self.steps, before)
        return exchanges(self.steps, before, self.memo, self.settled)


@dataclass(frozen=True)
class _Kept:
    created_at: float
    incarnation: str | None  # the run row's (None: a row made before migration 0017)
    steps: tuple[Step, ...]  # the settled prefix: steps[i].index == i
    memo: dict[int, Exchange | None]
    weight: int  # of its steps


class TranscriptCache:
    """The settled steps of the runs this process carried (see the module
    docstring); thread-safe (a threads pool's step threads share it)."""

    def __init__(self, max_weight: int = MAX_WEIGHT) -> None:
        self._max = max_weight
        self._runs: OrderedDict[str, _Kept] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        #: Reads that could use what was kept, and reads of a whole run (tests, bench).
        self.hits = 0
        self.misses = 0

    def read(self, store: Store, run: Run) -> History:
        """``run``'s steps, as loaded for the turn it was claimed at: the kept
        ones, checked, and the rest read from the store."""
        kept = self._get(run)
        steps = self._read_after(store, run, kept) if kept is not None else None
        if steps is None:
            kept = None
            steps = store.steps(run.run_id)
            if not _contiguous(steps, 0):
                return History(steps, 0)  # not a shape to keep: used as it was read
        end = len(kept.steps) if kept is not None else 0
        heavy = kept.weight if kept is not None else 0
        while end < len(steps) and settled(steps[end], run.cursor):
            heavy += weight(steps[end])
            end += 1
        memo = kept.memo if kept is not None else {}
        if end > (0 if kept is None else len(kept.steps)):
            kept = _Kept(run.created_at, run.incarnation, tuple(steps[:end]), memo, heavy)
            self._put(run, kept)
        return History(steps, end, memo)

    def forget(self, run_id: str) -> None:
        """Drop what is kept of ``run_id`` (nothing if none is)."""
        with self._lock:
            kept = self._runs.pop(run_id, None)
            if kept is not None:
                self._weight -= kept.weight

    def kept(self, run_id: str) -> int:
        """How many of ``run_id``'s steps are kept."""
        with self._lock:
            kept = self._runs.get(run_id)
            return 0 if kept is None else len(kept.steps)

    def _get(self, run: Run) -> _Kept | None:
        with self._lock:
            kept = self._runs.get(run.run_id)
            if kept is None:
                self.misses += 1
                return None
            if not _same_run(kept, run) or len(kept.steps) > run.step_count:
                self._runs.pop(run.run_id)  # another run under the same id
                self._weight -= kept.weight
                self.misses += 1
                return None
            self._runs.move_to_end(run.run_id)
            self.hits += 1
            return kept

    def _read_after(self, store: Store, run: Run, kept: _Kept) -> list[Step] | None:
        """The run's steps: the kept ones, then those read from the last kept
        one on (read again as the check). None: what was kept is not the
        run's any more (the caller reads it whole)."""
        if not kept.steps:
            return None
        last = kept.steps[-1]
        after = store.steps(run.run_id, last.index)
        if not after or after[0] != last or not _contiguous(after, last.index):
            self.forget(run.run_id)
            return None
        return [*kept.steps, *after[1:]]

    def _put(self, run: Run, kept: _Kept) -> None:
        if kept.weight > self._max:
            self.forget(run.run_id)
            return
        with self._lock:
            old = self._runs.pop(run.run_id, None)
            more = old is not None and len(old.steps) > len(kept.steps)
            if more and old is not None and _same_run(old, run):
                kept = old  # another thread kept more meanwhile
            self._weight += kept.weight - (0 if old is None else old.weight)
            self._runs[run.run_id] = kept
            while self._weight > self._max and len(self._runs) > 1:
                _, dropped = self._runs.popitem(last=False)
                self._weight -= dropped.weight


def _same_run(kept: _Kept, run: Run) -> bool:
    """Was ``kept`` kept of ``run``, not of another under its id? Rows made
    before migration 0017 have no incarnation: None is one value, and the
    creation time alone tells them apart, as before."""
    return kept.incarnation == run.incarnation and kept.created_at == run.created_at


def _contiguous(steps: Sequence[Step], start: int) -> bool:
    """Are ``steps`` the indices ``start``, ``start + 1``, ... in order?"""
    return all(step.index == start + i for i, step in enumerate(steps))
