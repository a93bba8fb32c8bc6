"""``async def`` tools and models on real workers, per pool: a run completes
with one loop per worker thread (one per process under prefork and solo),
a SIGKILL mid async call is handled per the tool's effect, and the step's
time limit cancels the coroutine (its ``finally`` runs in the worker)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import api
from tests.async_agents import AsyncScriptedModel
from tests.cluster import IMPORTS, Cluster

pytestmark = pytest.mark.slow

ASYNC_IMPORTS = IMPORTS + ",tests.async_agents"
assert AsyncScriptedModel  # the workers import that module; so does this one


#: Prefork and threads run on a production shape (PostgreSQL, Redis; RabbitMQ as
#: the broker once); solo is the embedded default's pool (SQLite, the filesystem broker).
SERVICES = (pytest.mark.postgres, pytest.mark.redis)
PREFORK = pytest.param("prefork", marks=SERVICES)
THREADS = pytest.param("threads", marks=SERVICES)


def _async_cluster(
    make_cluster: Callable[..., Cluster], pool: str, broker: str = "redis", **env: str
) -> Cluster:
    broker = "filesystem" if pool == "solo" else broker
    return make_cluster(broker, HARNESS_WORKER_POOL=pool, HARNESS_IMPORTS=ASYNC_IMPORTS, **env)


def _notes(c: Cluster) -> list[tuple[str, str, int, int, int]]:
    """(kind, key, thread, loop id, pid) of each note the async agents wrote."""
    path = Path(str(c.ledger_path) + ".notes")
    notes = []
    for line in path.read_text().splitlines() if path.exists() else ():
        kind, where, pid, _ = line.split()
        key, thread, loop = where.rsplit(":", 2)
        notes.append((kind, key, int(thread), int(loop), int(pid)))
    return notes


@pytest.mark.parametrize(
    ("pool", "broker"),
    [
        pytest.param("prefork", "redis", marks=SERVICES),
        pytest.param("threads", "redis", marks=SERVICES),
        pytest.param("prefork", "rabbitmq", marks=(*SERVICES, pytest.mark.rabbitmq)),
        ("solo", "filesystem"),
    ],
)
def test_async_runs_complete_on_one_loop_per_worker_thread(
    make_cluster: Callable[..., Cluster], pool: str, broker: str
) -> None:
    c = _async_cluster(make_cluster, pool, broker)
    c.beat()
    c.worker("--concurrency=2")
    run_ids = c.start("async-chain", count=3)
    c.assert_completed_once(run_ids)
    assert {api.get_run(r).result for r in run_ids} == {"3 async effects done"}
    notes = _notes(c)
    assert {kind for kind, *_ in notes} == {"model", "tool"}
    assert len(notes) == 3 * 7  # four model turns and three tool calls a run, none again
    loops = defaultdict(set)  # the loops each worker thread used, over all its calls
    for _, _, thread, loop, pid in notes:
        loops[pid, thread].add(loop)
    assert all(len(used) == 1 for used in loops.values()), loops
    threads_per_process = defaultdict(set)
    for pid, thread in loops:
        threads_per_process[pid].add(thread)
    if pool != "threads":  # one executing thread per process: one loop per process
        assert all(len(t) == 1 for t in threads_per_process.values())


@pytest.mark.parametrize("pool", [PREFORK, THREADS])
def test_a_killed_async_call_is_repeated_or_held_per_its_effect(
    make_cluster: Callable[..., Cluster], pool: str
) -> None:
    """SIGKILL mid call (the pool child under prefork, the whole worker under
    threads): the idempotent call is made again and completes, once more; the
    at_most_once call is never repeated: the step goes in doubt."""
    c = _async_cluster(make_cluster, pool)
    c.beat()
    worker = c.worker("--concurrency=2")
    (slow,) = c.start("async-slow")
    (mailer,) = c.start("async-mailer")
    keys = {f"{slow}:1", f"{mailer}:1"}
    c.wait_until("both calls under way", lambda: set(c.ledger().unfinished(c.killed)) == keys)
    if pool == "prefork":
        for pid in set(c.ledger().unfinished(c.killed).values()):
            c.kill_pid(pid)
    else:
        c.kill(worker)
        c.worker("--concurrency=2")
    done, held = c.wait_all([slow, mailer])
    assert (done.status.value, done.result) == ("completed", "effect done")
    assert held.status.value == "waiting"
    assert api.get_steps(mailer)[1].status == "in_doubt"
    ledger = c.ledger()
    assert ledger.unjustified_repeats(c.killed) == [] and ledger.overlapping(c.killed) == []
    assert (ledger.calls(f"{slow}:1"), ledger.effects(f"{slow}:1")) == (2, 1)
    assert (ledger.calls(f"{mailer}:1"), ledger.effects(f"{mailer}:1")) == (1, 0)


@pytest.mark.parametrize("pool", [PREFORK, THREADS])
def test_the_step_time_limit_cancels_an_async_tool_in_the_worker(
    make_cluster: Callable[..., Cluster], pool: str
) -> None:
    """Under threads no Celery time limit exists, under prefork it comes later
    (the limit plus the chain budget): the coroutine is cancelled at the step's
    limit in the worker, which lives on; the step is recovered like any call
    stopped at its limit and the next attempt completes."""
    # Prefork's own limit comes a tenth of the step's limit later: room for ours to be handled.
    limit = "8" if pool == "prefork" else "4"
    c = _async_cluster(make_cluster, pool, HARNESS_STEP_TIME_LIMIT=limit)
    c.beat()
    worker = c.worker("--concurrency=1")
    (run_id,) = c.start("async-stall")
    (run,) = c.wait_all([run_id])
    assert (run.status.value, run.result) == ("completed", "stalled once")
    assert api.get_steps(run_id)[1].result == "done on attempt 2"
    key = f"{run_id}:1"
    ledger = c.ledger()
    assert (ledger.calls(key), ledger.effects(key)) == (2, 1)  # cancelled, then done
    first = ledger.by_key[key][0]
    finallies = [n for n in _notes(c) if n[0] == "finally" and n[1] == key]
    assert len(finallies) == 2 and finallies[0][4] == first.pid  # it ran in that worker
    log = worker.log()
    assert "ran past the step's time limit: cancelled after" in log
    assert "SoftTimeLimitExceeded" not in log and "Hard time limit" not in log  # ours came first
    assert worker.proc.poll() is None and not c.killed
