"""bench.toolloop's agent loop in DBOS Transact and in LangGraph, in-process.

* DBOS: one ``@DBOS.workflow()`` calling a ``@DBOS.step()`` for each model
  turn and one for each tool call; DBOS checkpoints every step's output in
  its system database before the workflow goes on.
* LangGraph: a ``StateGraph`` of two nodes, ``model`` and ``tool``, the
  model routing to the tool or to the end, compiled with the sync
  ``PostgresSaver`` and invoked with ``durability="sync"``: one checkpoint
  written per node run (super-step) before the next one starts. Its state
  carries the run's tool results, as an agent's messages would.

Both run in the calling process against PostgreSQL: no broker, no worker
hop. :func:`measure` times runs one after another in this process (the
figure per step), then ``runs`` runs split over ``procs`` processes, each
doing its share one run after another (the figure per 1,000 runs): with the
GIL, a process runs one step at a time, so 2 processes is what 2 cores
allow, as 2 single-slot Celery workers are for the harness.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, TypedDict

from bench import toolloop

WARMUP = 5
#: A peer opened on a database: run one loop (its id -> its tool results), and close.
Opened = tuple[Callable[[str], list[int]], Callable[[], None]]


def open_dbos(url: str, executor: str) -> Opened:
    """The loop as a DBOS workflow on the system database ``url``; ``executor``
    names this process, so that a launch never recovers another's workflows."""
    from dbos import DBOS, DBOSConfig, SetWorkflowID

    DBOS.destroy(destroy_registry=True)

    @DBOS.step()
    def model_step(turn: int) -> str | None:
        return toolloop.next_call(turn)

    @DBOS.step()
    def tool_step(name: str, turn: int) -> int:
        return toolloop.call(name, turn)

    @DBOS.workflow()
    def agent_loop() -> list[int]:
        results: list[int] = []
        turn = 0
        while (name := model_step(turn)) is not None:
            results.append(tool_step(name, turn))
            turn += 1
        return results

    config: DBOSConfig = {
        "name": "harness-bench-toolloop",
        "system_database_url": url,
        "log_level": "WARNING",
        "executor_id": executor,
    }
    DBOS(config=config)
    DBOS.launch()

    def run(run_id: str) -> list[int]:
        with SetWorkflowID(run_id):
            return agent_loop()

    return run, lambda: DBOS.destroy(destroy_registry=True)


class LoopState(TypedDict):
    turn: int
    call: str | None
    results: list[int]


def open_langgraph(url: str, executor: str) -> Opened:
    """The loop as a LangGraph graph checkpointed by ``PostgresSaver`` on ``url``."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    def model(state: LoopState) -> dict[str, Any]:
        return {"call": toolloop.next_call(state["turn"])}

    def route(state: LoopState) -> str:
        return END if state["call"] is None else "tool"

    def tool(state: LoopState) -> dict[str, Any]:
        assert state["call"] is not None
        result = toolloop.call(state["call"], state["turn"])
        return {"results": [*state["results"], result], "turn": state["turn"] + 1}

    builder = StateGraph(LoopState)
    builder.add_node("model", model)
    builder.add_node("tool", tool)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tool", END])
    builder.add_edge("tool", "model")
    stack = contextlib.ExitStack()
    saver = stack.enter_context(PostgresSaver.from_conn_string(url))
    saver.setup()
    graph = builder.compile(checkpointer=saver)

    def run(run_id: str) -> list[int]:
        config: Any = {"configurable": {"thread_id": run_id}}
        state = LoopState(turn=0, call=None, results=[])
        out = graph.invoke(state, config, durability="sync")
        return list(out["results"])

    return run, stack.close


OPENERS: dict[str, Callable[[str, str], Opened]] = {
    "dbos": open_dbos,
    "langgraph": open_langgraph,
}


def importable(peer: str) -> bool:
    """Whether ``peer``'s library is installed here (the ``bench`` extra)."""
    module = {"dbos": "dbos", "langgraph": "langgraph.checkpoint.postgres"}[peer]
    try:
        import_module(module)
    except ImportError:
        return False
    return True


def one_run(run: Callable[[str], list[int]]) -> float:
    """One run of the loop, checked; its wall seconds."""
    start = time.perf_counter()
    toolloop.expected(run(str(uuid.uuid4())))
    return time.perf_counter() - start


def _child(peer: str, url: str, index: int, runs: int, barrier: Any, out: Any) -> None:
    """A process of the parallel runs: open, warm up, wait for the others, run."""
    run, close = OPENERS[peer](url, f"bench-{index}")
    try:
        toolloop.race(lambda: one_run(run), WARMUP, runs, barrier, out)
    finally:
        close()


@dataclass(frozen=True)
class Measured:
    ms_per_step: float  # median run's wall / steps, runs one after another
    runs: int
    procs: int
    wall_s: float  # ``runs`` runs over ``procs`` processes


def measure(peer: str, url: str, sequential: int, runs: int, procs: int = 2) -> Measured:
    """``sequential`` runs in this process, then ``runs`` over ``procs`` processes."""
    run, close = OPENERS[peer](url, "bench-main")  # also creates the peer's tables
    try:
        for _ in range(WARMUP):
            one_run(run)
        per_run = [one_run(run) for _ in range(sequential)]
    finally:
        close()
    wall = toolloop.at_once(_child, (peer, url), runs, procs)
    return Measured(statistics.median(per_run) * 1000 / toolloop.STEPS_PER_RUN, runs, procs, wall)
