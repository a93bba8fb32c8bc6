"""The one agent loop every peer runs (issue 26, goal 6): a scripted model and 3 tools.

Model turn ``t`` (from 0) asks for tool ``TOOLS[t % 3]`` with ``{"i": t}``
until the run has made ``TOOL_CALLS`` calls; the next turn answers. One run
is therefore 7 model steps and 6 tool steps, ``STEPS_PER_RUN`` = 13, in
that order (model, tool, model, ..., model). Nothing is random and nothing
goes over the network: what a peer is timed on is its own bookkeeping per
step, on the same loop.

Standard library only: the Prefect loop imports it from a virtualenv of its
own, where neither the harness nor Celery is installed (bench/prefect_loop.py
says why).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

TOOL_CALLS = 6
STEPS_PER_RUN = 2 * TOOL_CALLS + 1


def lookup(i: int) -> int:
    """Tool 0: a trivial body."""
    return i + 1


def double(i: int) -> int:
    """Tool 1: a trivial body."""
    return 2 * i


def noop(i: int) -> int:
    """Tool 2: a trivial body."""
    return 0


TOOLS = {"loop_lookup": lookup, "loop_double": double, "loop_noop": noop}
NAMES = tuple(TOOLS)


def next_call(turn: int) -> str | None:
    """The scripted model: the tool model turn ``turn`` asks for, or None for
    the final answer."""
    return NAMES[turn % len(NAMES)] if turn < TOOL_CALLS else None


def call(name: str, i: int) -> int:
    return TOOLS[name](i)


def expected(results: list[int]) -> None:
    """Raise unless ``results`` are a whole run's tool results."""
    want = [call(next_call(t) or "", t) for t in range(TOOL_CALLS)]
    if results != want:
        raise RuntimeError(f"a run's tool results are {results}, not {want}")


def at_once(target: Callable[..., None], args: tuple[Any, ...], runs: int, procs: int) -> float:
    """Wall seconds for ``runs`` runs split over ``procs`` spawned processes,
    timed from when every one is warm: process ``i`` calls
    ``target(*args, i, its share of the runs, barrier, out)``, which warms
    up, waits on ``barrier``, runs its share and puts when it finished on
    ``out`` (:func:`race` does all that)."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
    shares = [runs // procs + (i < runs % procs) for i in range(procs)]
    children = [
        ctx.Process(target=target, args=(*args, i, n, barrier, out)) for i, n in enumerate(shares)
    ]
    for child in children:
        child.start()
    barrier.wait(timeout=120)  # a child that failed to start breaks it
    start = time.perf_counter()
    ends = [out.get(timeout=3600) for _ in children]
    for child in children:
        child.join()
    return max(ends) - start


def race(one_run: Callable[[], object], warmup: int, runs: int, barrier: Any, out: Any) -> None:
    """A process of :func:`at_once`: ``warmup`` runs, the others awaited, ``runs`` runs."""
    for _ in range(warmup):
        one_run()
    barrier.wait()
    for _ in range(runs):
        one_run()
    out.put(time.perf_counter())
