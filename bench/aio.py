"""What awaiting an ``async def`` tool costs a step, against a plain one.

    python -m bench.aio [--calls 20000]

In one process, one thread: ``ToolSpec.invoke`` of a plain ``def`` tool (the
baseline), of the same tool as ``async def`` (harness.aio: this thread's
loop, kept), and the coroutine run the way the harness does not, a new loop
per call (``asyncio.run``). Each figure is the median of five rounds of
``--calls`` calls, in microseconds per call, and its ratio to the baseline
of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable

import harness
from harness.tools import ToolContext

CTX = ToolContext("bench", 1, 1)


@harness.tool(effect="read_only")
def plain(city: str) -> dict[str, str]:
    return {"city": city}


@harness.tool(effect="read_only")
async def awaited(city: str) -> dict[str, str]:
    await asyncio.sleep(0)
    return {"city": city}


def _per_call_us(call: Callable[[], object], calls: int) -> float:
    rounds = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(calls):
            call()
        rounds.append((time.perf_counter() - began) / calls * 1e6)
    return statistics.median(rounds)


def main(calls: int) -> dict[str, float]:
    kwargs = {"city": "Oslo"}
    figures = {
        "plain def tool, invoke": _per_call_us(lambda: plain.invoke(kwargs, CTX), calls),
        "async def tool, invoke (the thread's loop, kept)": _per_call_us(
            lambda: awaited.invoke(kwargs, CTX, timeout=900.0), calls
        ),
        "async def tool, asyncio.run per call (not used)": _per_call_us(
            lambda: asyncio.run(awaited.fn(**kwargs)), calls
        ),
    }
    base = figures["plain def tool, invoke"]
    for name, value in figures.items():
        print(f"{name:<52} {value:8.1f} us/call  {value / base:6.2f}x")
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    print(json.dumps(main(parser.parse_args().calls)))
