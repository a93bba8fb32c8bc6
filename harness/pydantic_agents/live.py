"""Live runs: a Pydantic AI agent's run kept parked between its steps.

Re-running an agent from its start at every step costs a step time that
grows with the run (each re-run passes every operation done so far through
Pydantic AI's graph: bench/pydantic_ai.py). So a step leaves its run parked
at its next operation (harness.pydantic_agents.journal), as a task on this
thread's event loop (harness.aio keeps it from call to call), and the next
step of that run, if it is taken in this thread, carries on from there.

A parked run is only carried on if it still matches the run's steps: parked
at this step's operation, and every result it used equal to the one
recorded (a step taken over by another worker, a rejected call, a fork: any
difference, and the agent is re-run from its start instead). So a live run
is a cache: it changes what a step costs, never what it does. At most
:data:`KEPT` runs are kept per thread; the oldest is stopped first. A tool
step returns as its tool does: the agent's code after it (instructions,
history processors) runs on whenever this thread's loop next runs (the next
step in this thread, of this run or another), and the run's next step here
waits for it to park before it looks at it. The runs of a loop that
harness.aio closes are dropped with it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from harness import aio
from harness.pydantic_agents.journal import Replay, drive

#: Parked runs kept per thread (event loop).
KEPT = 64

#: The kept runs of each open loop (its tasks hold the loop: dropped when it closes).
_LIVE: dict[asyncio.AbstractEventLoop, OrderedDict[str, _Live]] = {}


def _closed(loop: asyncio.AbstractEventLoop) -> None:
    """harness.aio closes ``loop``: its runs (cancelled with it) are dropped."""
    _LIVE.pop(loop, None)


aio.on_close(_closed)


class _Live:
    """A run's task and its :class:`Replay`."""

    def __init__(self, replay: Replay, task: asyncio.Task[None]) -> None:
        self.replay = replay
        self.task = task

    def fits(self, fresh: Replay) -> bool:
        """Parked at ``fresh``'s target, having used exactly what it records."""
        replay = self.replay
        return (
            not self.task.done()
            and not replay.tainted
            and replay.parked is not None
            and replay.parked[0] == fresh.target
            and replay.got_responses == fresh.responses
            and replay.got_results == fresh.results
        )

    def stop(self) -> None:
        self.replay.stop()


async def advance(binding: Any, key: str, prompt: str, fresh: Replay, step: Any = None) -> Replay:
    """Carry out ``fresh.target`` of run ``key``: on its parked run if that
    fits, else with ``fresh`` (what the run's steps record), on a new run of
    ``binding.agent`` on ``prompt`` from its start. Returns when the run has
    parked again or ended, or the target tool returned; raises what the
    agent's run raised before that."""
    kept = _LIVE.setdefault(asyncio.get_running_loop(), OrderedDict())
    live = kept.pop(key, None)
    if live is not None:
        await _within_step(live, live.replay.resting)  # the last step's tail runs first
    fresh.step = step
    if live is not None and live.fits(fresh):
        live.replay.resume(fresh)
    else:
        if live is not None:
            live.stop()
        live = _start(binding, prompt, fresh)
    await _within_step(live, live.replay.settled)
    replay = live.replay
    if live.task.done():
        error = None if live.task.cancelled() else live.task.exception()
        if error is not None and not replay.returned:  # after it: the next step's
            raise error
    else:
        kept[key] = live
        while len(kept) > KEPT:
            kept.popitem(last=False)[1].stop()
    return live.replay


async def _within_step(live: _Live, event: asyncio.Event) -> None:
    """Wait for ``event`` of ``live``'s run; if the step's time runs out
    meanwhile, the run is cancelled with it."""
    try:
        await event.wait()
    except asyncio.CancelledError:  # the step's time ran out: so does the call
        live.task.cancel()
        await asyncio.wait({live.task})  # its finally blocks run within the step
        raise


def _start(binding: Any, prompt: str, replay: Replay) -> _Live:
    task = asyncio.get_running_loop().create_task(
        drive(binding.agent, replay, prompt, binding.deps, binding.usage_limits)
    )
    task.add_done_callback(_retrieved)
    return _Live(replay, task)


def _retrieved(task: asyncio.Task[None]) -> None:
    """A run that ends unwatched (its tail after a tool step, a run stopped)
    has its error read: the step that re-runs it meets the same error."""
    if not task.cancelled():
        task.exception()
