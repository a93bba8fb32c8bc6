"""Agents and tasks for the benchmarks (``HARNESS_IMPORTS=bench.agents``).

* ``bench.hop``: the baseline, a bare Celery task on the same app and broker
  that sends itself again until a count runs out (no store, no cache);
* ``bench.floor_hop``: the same hop plus the SQL and Redis round trips of a
  ``bench-loop`` step and nothing else: the floor under a durable step;
* ``bench.fast_floor_hop``: the hop plus one primary-key SELECT and one
  compare-and-swap UPDATE, committed: the floor under the fast path (a step
  safe to rerun, whose result checkpoint is its only write);
* ``bench-loop``: a run alternating model steps and no-op tool steps until it
  has the number of steps its goal names (``"steps 2000"``); the model never
  reads the history, so nothing grows with the run's length;
* ``bench-loop-read``: the same with a ``read_only`` tool: every step, model
  and tool, takes the fast path (no RUNNING checkpoint: a load and a result
  write; the tool's step still claims its key in Redis);
* ``bench-loop-fast``: the same as ``bench-loop`` in throughput mode (up to 20 steps per task);
* ``bench-slow-tool``: one 1.5 s tool call, for the recovery benchmark;
* ``bench-loop-api``: ``bench-loop`` whose tool waits 20 ms, as a call to
  an outside service would (the replay benchmark);
* ``bench-queued``: one 100 ms call, then an answer (the backlog benchmark);
* ``bench-tools3``: the peers' 3-tool loop (bench.toolloop), 7 model steps and
  6 tool steps; ``bench.loop_model`` and ``bench.loop_tool``: the same loop as
  plain Celery tasks, each sending the next, its state only in the messages
  (the no-durability reference of bench.agentloop).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg
import redis

import harness
from bench import toolloop
from bench.common import FLOOR_TABLE
from harness.models import ModelRequest, ModelTurn, ToolCall
from tasks import app


@app.task(name="bench.hop", acks_late=True, reject_on_worker_lost=True)
def hop(remaining: int, done_file: str) -> None:
    """One hop of a chain: send the next, or record when the last one ran."""
    if remaining > 1:
        hop.delay(remaining - 1, done_file)
    else:
        _done(done_file)


_floor: dict[str, Any] = {}


@app.task(name="bench.floor_hop", acks_late=True, reject_on_worker_lost=True)
def floor_hop(remaining: int, done_file: str, chain: str) -> None:
    """A hop that also makes the round trips of a ``bench-loop`` step, and
    nothing else: read the chain's row, then, on every other hop (a tool
    step), claim a Redis key and commit an "about to execute" CAS update,
    and on every hop commit the result CAS update. The floor under any
    design that checkpoints as DESIGN.md asks, on this database and cache.
    """
    pg, version = _floor_read(chain)
    if remaining % 2:  # a tool step: the idempotency claim, the RUNNING checkpoint
        if _floor["redis"] is not None:
            _floor["redis"].set(f"bench:floor:{chain}:{remaining}", "x", nx=True, px=60_000)
        pg.execute(_CAS, (chain, version))
        version += 1
    pg.execute(_CAS, (chain, version))
    if remaining > 1:
        floor_hop.delay(remaining - 1, done_file, chain)
    else:
        _done(done_file)


@app.task(name="bench.fast_floor_hop", acks_late=True, reject_on_worker_lost=True)
def fast_floor_hop(remaining: int, done_file: str, chain: str) -> None:
    """A hop that also reads the chain's row by its key and commits one
    compare-and-swap update of it: the floor under the fast path, a step
    safe to rerun that goes straight to execution and writes only its result."""
    pg, version = _floor_read(chain)
    pg.execute(_CAS, (chain, version))
    if remaining > 1:
        fast_floor_hop.delay(remaining - 1, done_file, chain)
    else:
        _done(done_file)


_READ = f"SELECT v FROM {FLOOR_TABLE} WHERE chain = %s"
_CAS = f"UPDATE {FLOOR_TABLE} SET v = v + 1 WHERE chain = %s AND v = %s"


def _floor_read(chain: str) -> tuple[psycopg.Connection[Any], int]:
    """This process's floor connection (made on first use, like the store's
    pool) and the chain's version, read by its primary key."""
    if not _floor:
        url = os.environ["HARNESS_DATABASE_URL"].replace("+psycopg", "")
        _floor["pg"] = psycopg.connect(url, autocommit=True)
        cache = os.environ.get("HARNESS_REDIS_URL")
        _floor["redis"] = redis.Redis.from_url(cache) if cache else None
    pg: psycopg.Connection[Any] = _floor["pg"]
    row = pg.execute(_READ, (chain,)).fetchone()
    assert row is not None, f"no floor row for chain {chain}"
    return pg, int(row[0])


def _done(done_file: str) -> None:
    """Record when the last hop ran: written whole, then renamed, so a reader
    never sees it empty."""
    done = Path(done_file)
    partial = done.with_name(f".{done.name}.partial")
    partial.write_text(f"{time.time():.6f}")
    partial.replace(done)


def total_steps(goal: str) -> int:
    return int(goal.split()[-1])


class LoopModel:
    """Asks for one ``noop`` call per turn until the run has ``total_steps`` steps."""

    #: Free and deterministic, like ScriptedModel: its turns are not recorded
    #: before their checkpoint, and its steps take the fast path.
    records_responses = False

    def __init__(self, tool: str = "noop") -> None:
        self.tool = tool

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        if request.step_index + 1 >= total_steps(request.goal):
            return ModelTurn(final="done")
        return ModelTurn(tool_calls=(ToolCall(self.tool, {"i": request.turn}),))


@harness.tool(effect="idempotent")
def noop(i: int) -> int:
    """An idempotent tool that does nothing: the step's cost is the harness's own."""
    return i


@harness.tool(effect="read_only")
def lookup(i: int) -> int:
    """A read-only tool that does nothing."""
    return i


@harness.tool(effect="idempotent")
def slow_call(seconds: float, ctx: harness.ToolContext) -> str:
    """Log the call's start (key, pid, time) to BENCH_LEDGER, then wait."""
    line = f"{ctx.idempotency_key} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["BENCH_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    time.sleep(seconds)
    return "ok"


@harness.tool(effect="idempotent")
def api_call(i: int) -> int:
    """An idempotent call to a service 20 ms away."""
    time.sleep(API_LATENCY)
    return i


API_LATENCY = 0.02
MAX_STEPS = 20_001
SLOW_CALL = 1.5  # seconds: long enough to be killed in, short enough for 20 rounds

harness.register_agent(
    harness.Agent("bench-loop", LoopModel(), tools=[noop, lookup], max_steps=MAX_STEPS)
)
harness.register_agent(
    harness.Agent("bench-loop-read", LoopModel("lookup"), tools=[lookup], max_steps=MAX_STEPS)
)
harness.register_agent(
    harness.Agent(
        name="bench-slow-tool",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "slow_call", "args": {"seconds": SLOW_CALL}}]},
                {"final": "done"},
            ]
        ),
        tools=[slow_call],
    )
)
harness.register_agent(
    harness.Agent(
        "bench-loop-fast", LoopModel(), tools=[noop, lookup], max_steps=MAX_STEPS, steps_per_task=20
    )
)
harness.register_agent(
    harness.Agent("bench-loop-api", LoopModel("api_call"), tools=[api_call], max_steps=MAX_STEPS)
)
harness.register_agent(
    harness.Agent(
        "bench-queued",
        harness.ScriptedModel(
            [{"tool_calls": [{"name": "slow_call", "args": {"seconds": 0.1}}]}, {"final": "done"}]
        ),
        tools=[slow_call],
    )
)

# A model reached over HTTP (``OPENAI_BASE_URL``): the waiting benchmark points it at a
# local server that answers in the OpenAI wire format after a delay (tests.wire).
harness.register_agent(
    harness.Agent(
        "bench-remote", harness.OpenAIModel("bench-model", timeout=30), tools=[noop], max_steps=10
    )
)


class ToolLoopModel:
    """bench.toolloop's scripted model: tool ``turn % 3`` until 6 calls, then the answer."""

    records_responses = False  # free and deterministic, like LoopModel

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        name = toolloop.next_call(request.turn)
        if name is None:
            return ModelTurn(final="done")
        return ModelTurn(tool_calls=(ToolCall(name, {"i": request.turn}),))


@harness.tool(name="loop_lookup", effect="idempotent")
def loop_lookup(i: int) -> int:
    """bench.toolloop's tool 0."""
    return toolloop.lookup(i)


@harness.tool(name="loop_double", effect="idempotent")
def loop_double(i: int) -> int:
    """bench.toolloop's tool 1."""
    return toolloop.double(i)


@harness.tool(name="loop_noop", effect="idempotent")
def loop_noop(i: int) -> int:
    """bench.toolloop's tool 2."""
    return toolloop.noop(i)


harness.register_agent(
    harness.Agent(
        "bench-tools3", ToolLoopModel(), tools=[loop_lookup, loop_double, loop_noop], max_steps=20
    )
)

#: Where ``bench.loop_model`` reports a finished chain: a Redis list of
#: "run sent_at done_at" on the cache (HARNESS_REDIS_URL).
LOOP_DONE = "bench:toolloop:done"
_loop: dict[str, Any] = {}


@app.task(name="bench.loop_model", acks_late=True, reject_on_worker_lost=True)
def loop_model(run: str, sent: float, turn: int, results: list[int]) -> None:
    """A model step of the plain-Celery loop: send the tool step, or report the answer."""
    name = toolloop.next_call(turn)
    if name is not None:
        loop_tool.delay(run, sent, turn, name, results)
        return
    toolloop.expected(results)
    if "redis" not in _loop:
        _loop["redis"] = redis.Redis.from_url(os.environ["HARNESS_REDIS_URL"])
    _loop["redis"].rpush(LOOP_DONE, f"{run} {sent:.6f} {time.time():.6f}")


@app.task(name="bench.loop_tool", acks_late=True, reject_on_worker_lost=True)
def loop_tool(run: str, sent: float, turn: int, name: str, results: list[int]) -> None:
    """A tool step of the plain-Celery loop: call the tool, send the next model step."""
    loop_model.delay(run, sent, turn + 1, [*results, toolloop.call(name, turn)])
