"""``python -m bench.modelcpu``: the harness's own CPU per model step (issue 26, goal 3).

    python -m bench.modelcpu [RUNS] [TURNS] [--profile]

RUNS runs of ``bench-remote-long`` (TURNS model turns each, a no-op tool
call between two), carried in this process by the runner in a loop (no
broker: the step messages are queued here, as ``bench/compare.py`` does),
on PostgreSQL + Redis, the model an ``OpenAIModel`` reached through the real
``openai`` SDK on a local server of its wire format (``tests.wire``, in a
process of its own, answering at once). Beside it, the bare loop: the same
requests (the same conversations, streamed, as the harness sends them) made
with the same SDK, their event streams read and decoded, and nothing else.

It prints the CPU time (``time.process_time``) per model step of the
harness's loop, per call of the bare loop, and their difference: what the
harness adds to a model call, the store's work included. With ``--profile``
the model steps and the bare loop are profiled (cProfile on CPU time) and
split by layer, as ``bench.cpu`` does. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import harness
from bench.agents import noop
from bench.common import REPO, Setup
from bench.cpu import attribute, hot

AGENT = "bench-remote-long"
MAX_TURNS = 100

_SERVER = """
import sys, time
from tests.wire import WireServer
turns = int(sys.argv[1])
script = [{"tool_calls": [{"name": "noop", "args": {"i": t}}]} for t in range(turns - 1)]
server = WireServer(default=[*script, {"text": "done"}]).start()
print(server.openai_base_url, flush=True)
sys.stdin.read()
"""


def serve(turns: int) -> tuple[subprocess.Popen[str], str]:
    """The wire server in a process of its own (its CPU is not ours); its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(turns)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def harness_loop(runs: int, turns: int, profiler: cProfile.Profile | None) -> tuple[float, int]:
    """CPU seconds spent in model steps, and their number."""
    from harness import api
    from harness.engine import creation, runner

    queue: list[tuple[str, int, Any]] = []
    rt = replace(
        api.runtime(),
        dispatch=lambda run_id, cursor, hint=None, **_: queue.append((run_id, cursor, hint)),
    )
    cpu, count = 0.0, 0
    for i in range(runs):
        creation.create_run(rt, AGENT, f"run {i} of {time.monotonic_ns()}")
        while queue:
            run_id, cursor, hint = queue.pop()
            model = cursor % 2 == 0  # model turns at even steps, calls at odd ones
            if model and profiler is not None:
                profiler.enable()
            began = time.process_time()
            runner.run_step(rt, run_id, cursor, hint)
            if model:
                cpu += time.process_time() - began
                count += 1
                if profiler is not None:
                    profiler.disable()
    assert count == runs * turns, (count, runs, turns)
    return cpu, count


def bare_loop(
    url: str, runs: int, turns: int, profiler: cProfile.Profile | None, verbatim: bool = True
) -> tuple[float, int]:
    """CPU seconds of the same calls made with the SDK alone, and their number.
    ``verbatim``: the messages and tools in ``extra_body``, as the harness
    sends them (ProviderModel.verbatim); otherwise as the method's arguments,
    which the SDK walks against their declared types first."""
    import json

    import openai

    client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {"name": "noop", "description": "noop", "parameters": noop.schema()},
        }
    ]
    cpu, count = 0.0, 0
    for i in range(runs):
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"bare {i}"}]
        for t in range(turns):
            if profiler is not None:
                profiler.enable()
            began = time.process_time()
            if verbatim:
                fields: dict[str, Any] = {"messages": [], "extra_body": {"messages": messages}}
                fields["extra_body"]["tools"] = tools
            else:
                fields = {"messages": messages, "tools": tools}
            with client.chat.completions.with_streaming_response.create(
                model="bench-model",
                **fields,
                stream=True,
                stream_options={"include_usage": True},
                timeout=30,
            ) as response:
                chunks = [
                    json.loads(line[6:])
                    for line in response.iter_lines()
                    if line.startswith("data: {")
                ]
            cpu += time.process_time() - began
            count += 1
            if profiler is not None:
                profiler.disable()
            assert chunks
            call = {"id": f"call_{t}_0", "type": "function"}
            call["function"] = {"name": "noop", "arguments": json.dumps({"i": t})}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(t)})
    return cpu, count


def _layers(title: str, stats: pstats.Stats, per: float, calls: int) -> None:
    layers = attribute(stats)
    total = sum(layers.values())
    print(f"\n{title}: {total * 1000 / calls:.3f} ms CPU/call profiled, scaled to {per:.3f}")
    for name, seconds in layers.most_common(14):
        print(f"  {seconds / total:6.1%}  {seconds / total * per:6.3f} ms  {name}")


@dataclass(frozen=True)
class ModelCPU:
    """CPU milliseconds per model call."""

    harness: float  # a model step, in-process
    bare: float  # the same SDK call alone (the messages and tools in extra_body)
    documented: float  # the SDK call with the messages and tools as its arguments
    calls: int

    @property
    def own(self) -> float:
        """What the harness adds to the call it makes."""
        return self.harness - self.bare


def measure(runs: int, turns: int, profile: bool = False) -> ModelCPU:
    """The CPU figures of RUNS runs of TURNS turns; with ``profile``, the
    profiles' tables printed too."""
    server, url = serve(turns)
    model = harness.OpenAIModel("bench-model", timeout=30)
    agent = harness.Agent(AGENT, model, tools=[noop], max_steps=2 * MAX_TURNS)
    try:
        with Setup("redis", OPENAI_BASE_URL=url, OPENAI_API_KEY="bench"):
            harness.register_agent(agent)
            harness_loop(2, turns, None)  # warm-up: the client, the statements
            bare_loop(url, 2, turns, None)
            h_cpu, h_n = harness_loop(runs, turns, None)
            b_cpu, b_n = bare_loop(url, runs, turns, None)
            d_cpu, d_n = bare_loop(url, runs, turns, None, verbatim=False)
            figures = ModelCPU(h_cpu * 1000 / h_n, b_cpu * 1000 / b_n, d_cpu * 1000 / d_n, h_n)
            if profile:
                mine = cProfile.Profile(time.process_time)
                bare = cProfile.Profile(time.process_time)
                harness_loop(runs, turns, mine)
                bare_loop(url, runs, turns, bare)
                _tables(figures, pstats.Stats(mine), pstats.Stats(bare))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)
    return figures


def _tables(figures: ModelCPU, mine: pstats.Stats, bare: pstats.Stats) -> None:
    _layers("harness model step", mine, figures.harness, figures.calls)
    _layers("bare SDK call", bare, figures.bare, figures.calls)
    for layer in ("harness", "openai", "SQLAlchemy", "psycopg"):
        print(f"\n{layer}: cumulative CPU, ms per model step (profiled)")
        for seconds, name in hot(mine, layer, 25 if layer == "harness" else 8):
            print(f"  {seconds * 1000 / figures.calls:6.3f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=int, default=30)
    parser.add_argument("turns", nargs="?", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    f = measure(args.runs, args.turns, args.profile)
    print(
        f"model step, harness in-process: {f.harness:.3f} ms CPU; bare SDK call, the same "
        f"call: {f.bare:.3f} ms (with the messages as arguments: {f.documented:.3f} ms); "
        f"the harness's own: {f.own:.3f} ms ({args.runs} runs x {args.turns} turns)"
    )


if __name__ == "__main__":
    main()
