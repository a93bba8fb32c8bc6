"""In-process cost per durable step of two peer libraries, on our PostgreSQL.

    pip install -e '.[bench]'        # dbos, langgraph, langgraph-checkpoint-postgres
    python -m bench.peers --steps 1000 --repeat 3

Both run in this process against ``PG_BASE`` (bench.common's server),
each on a database dropped and created afresh, with a no-op step body, so
what is timed is each library's own bookkeeping plus its checkpoint writes:

* DBOS Transact: one ``@DBOS.workflow()`` calling ``steps`` no-op
  ``@DBOS.step()`` functions in a loop; every step's output is checkpointed
  in the system database before the next one starts. Figure: wall time of
  the workflow call / ``steps``, after a 50-step warm-up workflow.
* LangGraph: a graph with one no-op node looping to itself through a
  conditional edge on a counter until it has run ``steps`` times, compiled
  with the sync ``PostgresSaver``; one checkpoint per super-step. Figure:
  wall time of ``invoke`` / ``steps``, after a 50-step warm-up thread.
  ``durability`` is passed to ``invoke``: ``"sync"`` writes each checkpoint
  before the next step (the comparable mode), ``"async"`` (LangGraph's
  default, also what ``None`` gives) overlaps the write with the next step.

Neither figure includes a broker or a worker hop: compare them with our
in-process step cost, not with the end-to-end Celery figures.
"""

from __future__ import annotations

import argparse
import time
import uuid
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypedDict, cast

import psycopg

from bench.common import PG_URL

#: The server and name of bench.common's database; each peer's database is named after it.
PG_BASE, _BENCH_DB = PG_URL.replace("+psycopg", "").rsplit("/", 1)
DBOS_DB = f"{_BENCH_DB}_dbos"
LANGGRAPH_DB = f"{_BENCH_DB}_langgraph"
WARMUP = 50


def available() -> dict[str, bool]:
    """Which peers can be imported here."""
    found: dict[str, bool] = {}
    for name, module in (("dbos", "dbos"), ("langgraph", "langgraph.checkpoint.postgres")):
        try:
            import_module(module)
            found[name] = True
        except ImportError:
            found[name] = False
    return found


def _fresh_database(name: str) -> str:
    """Drop and create ``name``; return its URL."""
    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_BASE}/{name}"


def dbos_ms_per_step(steps: int = 1000) -> float | None:
    """Wall ms per checkpointed ``@DBOS.step()`` in one workflow; None without dbos."""
    try:
        from dbos import DBOS, DBOSConfig
    except ImportError:
        return None
    url = _fresh_database(DBOS_DB)
    DBOS.destroy(destroy_registry=True)  # a previous call's instance and registrations

    @DBOS.step()
    def noop_step(i: int) -> int:
        return i

    @DBOS.workflow()
    def loop_workflow(n: int) -> int:
        for i in range(n):
            noop_step(i)
        return n

    config: DBOSConfig = {
        "name": "harness-bench-peers",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    try:
        DBOS.launch()
        loop_workflow(WARMUP)
        start = time.perf_counter()
        loop_workflow(steps)
        return (time.perf_counter() - start) * 1000 / steps
    finally:
        DBOS.destroy(destroy_registry=True)


class _Counter(TypedDict):
    n: int
    limit: int


def langgraph_ms_per_step(steps: int = 1000, durability: str | None = None) -> float | None:
    """Wall ms per node execution (= per checkpoint); None without langgraph."""
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Durability
    except ImportError:
        return None
    if durability not in (None, "sync", "async", "exit"):
        raise ValueError(f"unknown langgraph durability {durability!r}")
    mode = cast("Durability | None", durability)
    url = _fresh_database(LANGGRAPH_DB)

    def tick(state: _Counter) -> dict[str, int]:
        return {"n": state["n"] + 1}

    def again(state: _Counter) -> str:
        return "tick" if state["n"] < state["limit"] else END

    builder = StateGraph(_Counter)
    builder.add_node("tick", tick)
    builder.add_edge(START, "tick")
    builder.add_conditional_edges("tick", again, ["tick", END])
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)

        def run(n: int) -> float:
            config: Any = {
                "configurable": {"thread_id": str(uuid.uuid4())},
                "recursion_limit": n + 10,
            }
            start = time.perf_counter()
            out = graph.invoke(_Counter(n=0, limit=n), config, durability=mode)
            elapsed = time.perf_counter() - start
            if out["n"] != n:
                raise RuntimeError(f"langgraph ran {out['n']} steps, not {n}")
            return elapsed

        run(WARMUP)
        return run(steps) * 1000 / steps


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    have = available()
    measures: list[tuple[str, Any]] = []
    if have["dbos"]:
        measures.append((f"dbos {_version('dbos')}", lambda: dbos_ms_per_step(args.steps)))
    else:
        print("dbos: not installed")
    if have["langgraph"]:
        for mode in ("sync", "async"):
            label = f"langgraph {_version('langgraph')} durability={mode}"
            measures.append((label, lambda m=mode: langgraph_ms_per_step(args.steps, m)))
    else:
        print("langgraph: not installed")
    for _ in range(args.repeat):
        for label, measure in measures:
            print(f"{label}: {measure():.3f} ms/step ({args.steps} steps)", flush=True)


if __name__ == "__main__":
    main()
