"""``python -m bench.growth``: cost per step against concurrency and run length (issue 13, item 5).

A grid: CONCURRENCY runs at once (1, 10, 100, 1000) of LENGTH steps (10,
1000, 10000), on Redis + PostgreSQL with two worker processes of one prefork
slot each (``celery -A tasks worker --concurrency 1``), ``bench-loop`` runs.

Executing a thousand runs of 10,000 steps is out of reach, so the history is
seeded: one template run of the longest length is executed once, a template
of each shorter length is a fork of it ending at that length, and a cell's
runs are one fork of its length's template (``api.fork_run``) at step LENGTH -
WINDOW, with the goal ``steps LENGTH``, and copies of that fork made by SQL
(``bench.common.Batch.clone``: ``fork_run`` writes a fork's rows from Python,
2 s and more for 10,000 steps, too slow for a thousand). A fork copies the
recorded steps before that model step and continues live from it, so each
run of the cell has LENGTH - WINDOW steps of history in the database and
executes only its last WINDOW steps (and the final turn). Runs of 10 steps
are created, not forked, and executed whole. WINDOW is 1000 / CONCURRENCY, at least 10 and at most a
tenth of LENGTH, so a cell executes about a thousand steps or more.

The runs are created with their first messages held back, then released
together (bench.common.Batch). Per cell: ms/step, the wall time (first
message sent to last step committed) over the steps executed, its inverse in
steps/s, the median step latency (as bench.many defines it: queue wait
included), and the ratio to the baseline measured on the same workers, bare
Celery hops (``bench.hop``) in as many chains as the cell has runs.

Seeding a cell is timed (outside the clock), and a cell whose seeding at the
previous concurrency extrapolates to more than FORK_BUDGET seconds is not
run, and says so.
A measurement, not a test.

    python -m bench.growth [--concurrency 1,10,100,1000] [--lengths 10,1000,10000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Batch, Poller, Setup, finish_times
from bench.many import hop_chains, latencies
from bench.steps import harness_steps, window_ms
from harness import api
from harness.records import RunStatus

WORKERS = 2
FORK_BUDGET = 300.0  # seconds of seeding one cell may take (10M step rows: about 120 s here)
AGENT = "bench-loop"


@dataclass(frozen=True)
class Cell:
    concurrency: int
    length: int
    window: int  # steps of each run executed live (before its final turn)
    hop_ms: float  # wall ms per bare hop, as many chains as runs
    steps: int = 0  # executed, all runs
    wall: float = 0.0
    p50_ms: float = 0.0
    seed_s: float = 0.0  # creating or forking the runs, before the clock
    skipped: str = ""  # why the cell was not run

    @property
    def ms_per_step(self) -> float:
        return self.wall * 1000 / self.steps

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall

    @property
    def ratio(self) -> float:
        return self.ms_per_step / self.hop_ms


@dataclass
class Growth:
    workers: int
    template_s: float  # executing the template runs
    cells: list[Cell] = field(default_factory=list)
    #: ms/step over the first and the last tenth of the longest template run,
    #: executed live on its own: the cost of length without forks
    template_ms: tuple[float, float] = (0.0, 0.0)

    def cell(self, concurrency: int, length: int) -> Cell | None:
        return next(
            (c for c in self.cells if (c.concurrency, c.length) == (concurrency, length)), None
        )

    def as_dict(self) -> dict[str, Any]:
        cells = [asdict(c) if c.skipped else asdict(c) | _figures(c) for c in self.cells]
        return {
            "workers": self.workers,
            "template_s": self.template_s,
            "template_ms": self.template_ms,
            "cells": cells,
        }


def _figures(c: Cell) -> dict[str, float]:
    return {"ms_per_step": c.ms_per_step, "steps_per_s": c.steps_per_s, "ratio": c.ratio}


def window(concurrency: int, length: int) -> int:
    """Steps executed live per run: the whole of a 10-step run, else about
    1000 in all, at least 10 per run and at most a tenth of the run; even, so
    that the fork point is a model step."""
    if length <= 10:
        return length
    w = min(max(10, 1000 // concurrency), length // 10)
    return w - w % 2


def measure(
    concurrency: Sequence[int], lengths: Sequence[int], fork_budget: float = FORK_BUDGET
) -> Growth:
    with Setup("redis") as setup:
        setup.workers(WORKERS, ("--concurrency", "1"))
        hop_chains(setup, 50, chains=WORKERS)  # warm-up
        harness_steps(AGENT, 21, runs=2 * WORKERS)
        hops = {c: _hop_ms(setup, c) for c in concurrency}
        began = time.perf_counter()
        templates = seed_templates(lengths)
        growth = Growth(WORKERS, time.perf_counter() - began)
        if templates:
            steps = api.get_steps(templates[max(lengths)])
            width = max(10, len(steps) // 10)
            last = len(steps) - width - 1
            growth.template_ms = (window_ms(steps, 0, width), window_ms(steps, last, width))
        for length in sorted(lengths):
            per_fork = 0.0
            for c in sorted(concurrency):
                cell = Cell(c, length, window(c, length), hops[c])
                at = length - cell.window
                if at and per_fork * c > fork_budget:
                    cell = _skip(cell, per_fork)
                else:
                    cell = _run(cell, templates.get(length, ""), at)
                    per_fork = cell.seed_s / c
                growth.cells.append(cell)
                print(row(cell), flush=True)
        return growth


def _hop_ms(setup: Setup, chains: int) -> float:
    """The baseline: ms per bare hop, 2,000 hops or more in ``chains`` chains;
    the median of three where that takes a few seconds."""
    repeat = 3 if chains <= 100 else 1
    return statistics.median(
        hop_chains(setup, max(10, 2000 // chains), chains) for _ in range(repeat)
    )


def seed_templates(lengths: Sequence[int]) -> dict[int, str]:
    """A completed run of each length above 10 (with one more step, its final
    turn): the longest executed, the others forks of it at their length, so
    that a fork of one of them reads no more steps than it needs."""
    longest = max(lengths)
    if longest <= 10:
        return {}
    made = {longest: api.start_run(AGENT, f"steps {longest}")}
    _completed(made[longest])
    for n in lengths:
        if 10 < n < longest:
            made[n] = api.fork_run(made[longest], n, goal=f"steps {n}")
            _completed(made[n])
    return made


def _completed(run_id: str) -> None:
    run = api.wait_for(run_id, 1800, poll=0.5)
    assert run.status is RunStatus.COMPLETED, f"template {run.status}: {run.error}"


def _skip(cell: Cell, per_fork: float) -> Cell:
    rows = cell.concurrency * (cell.length - cell.window)
    why = f"not run: {rows / 1e6:.1f}M rows, ~{per_fork * cell.concurrency:.0f} s to fork"
    return Cell(cell.concurrency, cell.length, cell.window, cell.hop_ms, skipped=why)


def _run(cell: Cell, template: str, at: int) -> Cell:
    batch = Batch()
    goal = f"steps {cell.length}"
    began = time.perf_counter()
    if at:
        first = batch.fork(template, at, goal)
        ids = [first, *batch.clone(first, cell.concurrency - 1)]
    else:
        ids = [batch.start(AGENT, goal) for _ in range(cell.concurrency)]
    seed_s = time.perf_counter() - began
    poller = Poller()
    settled = poller.settled()
    sent = batch.release()
    poller.wait(settled + cell.concurrency, 1800)
    poller.close()
    finished = finish_times(ids, first=at)
    steps = sum(len(t) for t in finished.values())
    wall = max(t[-1] for t in finished.values()) - min(sent.values())
    p50 = statistics.median(latencies(finished, sent)) * 1000
    return Cell(cell.concurrency, cell.length, cell.window, cell.hop_ms, steps, wall, p50, seed_s)


def row(c: Cell) -> str:
    head = f"  {c.concurrency:>5} runs x {c.length:>6} steps:"
    if c.skipped:
        return f"{head} {c.skipped}"
    return (
        f"{head} {c.ms_per_step:6.2f} ms/step, {c.steps_per_s:6.0f} steps/s, "
        f"{c.ratio:4.2f}x the hop ({c.hop_ms:.2f} ms), p50 latency {c.p50_ms:.0f} ms "
        f"({c.steps} steps live, {c.window} per run; seeded in {c.seed_s:.1f} s)"
    )


def table(g: Growth) -> str:
    concurrency = sorted({c.concurrency for c in g.cells})
    lengths = sorted({c.length for c in g.cells})
    width = 26
    lines = [
        f"ms/step, steps/s and ratio to a bare hop; {g.workers} workers of concurrency 1, "
        "Redis + PostgreSQL",
        f"{'runs':>5}  {'bare hop':>14}  " + "  ".join(f"{f'{n} steps':>{width}}" for n in lengths),
    ]
    for c in concurrency:
        cells = [g.cell(c, n) for n in lengths]
        hop = next(x.hop_ms for x in cells if x is not None)
        texts = []
        for x in cells:
            if x is None:
                texts.append(f"{'':>{width}}")
            elif x.skipped:
                texts.append(f"{x.skipped:>{width}}")
            else:
                texts.append(
                    f"{f'{x.ms_per_step:.2f} ms {x.steps_per_s:.0f}/s {x.ratio:.2f}x':>{width}}"
                )
        lines.append(f"{c:>5}  {f'{hop:.2f} ms {1000 / hop:.0f}/s':>14}  " + "  ".join(texts))
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=_ints, default=[1, 10, 100, 1000])
    parser.add_argument("--lengths", type=_ints, default=[10, 1000, 10_000])
    parser.add_argument("--fork-budget", type=float, default=FORK_BUDGET)
    parser.add_argument("--out", type=Path, help="write growth.json and growth.png here")
    args = parser.parse_args()
    started = time.monotonic()
    g = measure(args.concurrency, args.lengths, args.fork_budget)
    early, late = g.template_ms
    print(
        f"\ntemplate runs seeded in {g.template_s:.1f} s; the {max(args.lengths)}-step one, "
        f"executed alone: {early:.2f} ms/step over its first tenth, {late:.2f} over its last"
    )
    print(table(g))
    print(f"took {time.monotonic() - started:.0f} s")
    if args.out:
        from bench import charts, suite  # the suite imports this module

        results = suite.Results(extra={"growth": g.as_dict()})
        (args.out / "growth.json").write_text(json.dumps(results.extra["growth"], indent=1))
        charts.growth(results, args.out / "growth.png")


if __name__ == "__main__":
    main()
