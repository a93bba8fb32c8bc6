"""What a step of a Pydantic AI agent costs, against a ``harness.Agent`` doing the same work.

    python -m bench.pydantic_ai [--lengths 10,100,300] [--rounds 3]

In one process, on the in-memory store, no broker: the runner
(``harness.engine.runner.run_step``) is called for each step as a worker
would. Both agents run LENGTH steps and a final answer: a model turn asking for one tool call,
the call, and so on, then a final answer. The baseline is a ``harness.Agent``
with a ``ScriptedModel`` and a plain ``@harness.tool``; the other is a
``pydantic_ai.Agent`` (a ``FunctionModel`` and a plain function tool)
registered with ``harness.register_pydantic_ai``, whose every step re-runs
the agent's code from its start, answering the operations already done from
the run's steps. Its runs are measured twice: as a worker takes them when
each step of a run comes to the same thread (the run kept parked between
steps, harness.pydantic_agents.live), and as when each step comes to another
worker (the agent re-run from its start at every step; for runs up to
``--rerun-up-to`` steps, the cost growing with the run). Per length: the
mean ms per step over the run, the ms of the run's last ten steps (what a
step costs that far into the run), and the ratio of each to the baseline of
the same length in the same run. Each
figure is the median of ``--rounds`` runs. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

import harness
from harness.clock import SystemClock
from harness.engine.creation import create_run
from harness.engine.executor import NoCache
from harness.engine.runner import run_step
from harness.engine.runtime import Runtime
from harness.engine.taskresult import TaskResult
from harness.pydantic_agents import live
from harness.store.memory import MemoryStore


@harness.tool(effect="read_only")
def add(n: int) -> int:
    return n


def _turns(length: int) -> int:
    """Model turns of a run of ``length`` steps and its final answer (one
    step more): each turn but the last asks for one call."""
    return length // 2 + 1


def harness_agent(length: int) -> str:
    turns = _turns(length)
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "add", "args": {"n": i}}]} for i in range(turns - 1)
    ]
    name = f"bench-harness-{length}"
    model = harness.ScriptedModel([*script, {"final": "done"}])
    harness.register_agent(harness.Agent(name=name, model=model, tools=[add], max_steps=1000))
    return name


def pydantic_agent(length: int) -> str:
    turns = _turns(length)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < turns - 1:
            return ModelResponse(parts=[ToolCallPart("add", {"n": turn}, f"c{turn}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = PydanticAgent(FunctionModel(model), name=f"bench-pydantic-{length}")

    @agent.tool_plain
    def add(n: int) -> int:
        return n

    limits = UsageLimits(request_limit=None)
    return harness.register_pydantic_ai(agent, max_steps=1000, usage_limits=limits).name


def step_times(agent: str) -> list[float]:
    """Seconds each step of one run of ``agent`` took, in order."""
    sent: list[tuple[str, int]] = []

    def send(run_id: str, cursor: int, **_: Any) -> None:
        sent.append((run_id, cursor))

    rt = Runtime(MemoryStore(), NoCache(), SystemClock(), "bench", 30.0, send)
    create_run(rt, agent, "go")
    times = []
    while sent:
        run_id, cursor = sent.pop(0)
        began = time.perf_counter()
        outcome = run_step(rt, run_id, cursor)
        times.append(time.perf_counter() - began)
        if outcome is TaskResult.COMPLETED:
            return times
        assert outcome is TaskResult.ADVANCED, outcome
    raise AssertionError("the run stopped before completing")


#: The agents measured: (label, runs kept live between steps).
LABELS = ("harness.Agent", "Pydantic AI", "Pydantic AI, re-run each step")


def measure(length: int, rounds: int, rerun_up_to: int) -> dict[str, float]:
    agents = {
        LABELS[0]: harness_agent(length),
        LABELS[1]: pydantic_agent(length),
        LABELS[2]: pydantic_agent(length),
    }
    figures: dict[str, float] = {}
    for label, agent in agents.items():
        if label == LABELS[2] and length > rerun_up_to:
            continue
        means, tails = [], []
        for _ in range(rounds):
            kept = live.KEPT
            live.KEPT = 0 if label == LABELS[2] else kept
            try:
                times = step_times(agent)
            finally:
                live.KEPT = kept
            assert len(times) == length + 1, (label, len(times))
            means.append(statistics.mean(times) * 1000)
            tails.append(statistics.mean(times[-10:]) * 1000)
        figures[f"{label} mean"] = statistics.median(means)
        figures[f"{label} last 10"] = statistics.median(tails)
    return figures


def main(lengths: list[int], rounds: int, rerun_up_to: int) -> dict[int, dict[str, float]]:
    results = {}
    print(f"{'steps':>5}  {'agent':<30} {'ms/step':>9} {'x':>7}  {'last 10':>9} {'x':>7}")
    for length in lengths:
        fig = measure(length, rounds, rerun_up_to)
        results[length] = fig
        base_mean, base_tail = fig["harness.Agent mean"], fig["harness.Agent last 10"]
        for label in LABELS:
            if f"{label} mean" not in fig:
                continue
            mean, tail = fig[f"{label} mean"], fig[f"{label} last 10"]
            print(
                f"{length:>5}  {label:<30} {mean:9.3f} {mean / base_mean:6.1f}x"
                f"  {tail:9.3f} {tail / base_tail:6.1f}x"
            )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="10,100,300")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rerun-up-to", type=int, default=100)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    print(json.dumps(main(lengths, args.rounds, args.rerun_up_to)))
