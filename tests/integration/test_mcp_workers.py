"""MCP tools carried by real `celery worker` processes (the embedded default,
Redis and RabbitMQ): a run calling tools of two stdio servers (ours, and the reference
time server from PyPI) completes; a worker SIGKILLed mid-call of an
idempotent tool has the call made again under the same key (the server saw
it in the request's ``_meta`` both times), mid-call of an ``at_most_once``
tool leaves the step in doubt; the MCP server SIGKILLed mid-call is started
again and the step retried (idempotent) or left in doubt (at_most_once).

The agents are in tests/mcp_agents.py; the server (tests.mcp_server) writes
the ledger under each call's key, and holds its ``held_*`` calls while the
hold file exists, so the kills land mid-call.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import api
from harness.records import RunStatus, StepStatus
from tests.cluster import Cluster
from tests.mcp_agents import IMPORTS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MakeCluster = Callable[..., Cluster]


@pytest.fixture
def servers() -> Iterator[set[int]]:
    """The pids of the MCP servers a test saw (in its ledger): none outlives it."""
    seen: set[int] = set()
    yield seen
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().split(")")[-1].split()[0] != "Z"


def mcp_cluster(make_cluster: MakeCluster, broker: str) -> Cluster:
    return make_cluster(broker, HARNESS_IMPORTS=IMPORTS)


def hold(c: Cluster) -> Path:
    held = Path(str(c.ledger_path) + ".hold")
    held.touch()
    return held


def started(c: Cluster, key: str, times: int = 1) -> Callable[[], bool]:
    return lambda: c.ledger().calls(key) >= times


def server_of(c: Cluster, key: str, servers: set[int]) -> int:
    pid = c.ledger().by_key[key][0].pid
    servers.add(pid)
    return pid


@pytest.mark.parametrize("broker", ["filesystem", "redis", "rabbitmq"])
def test_a_run_with_tools_of_two_mcp_servers_completes(
    make_cluster: MakeCluster, broker: str, servers: set[int]
) -> None:
    c = mcp_cluster(make_cluster, broker)
    worker = c.worker()
    (run_id,) = c.start("mcp-desk")
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.COMPLETED, f"{run}\n{c.logs()}"
    clock, weather, note = (s.result for s in api.get_steps(run_id)[1:4])
    assert isinstance(clock, dict) and clock["timezone"] == "UTC"
    assert weather == {"city": "Oslo", "celsius": 21.5}
    assert note == {"result": "noted: hello"}
    ledger = c.ledger()
    assert list(ledger.by_key) == [f"{run_id}:3"] and ledger.effects(f"{run_id}:3") == 1
    server = server_of(c, f"{run_id}:3", servers)
    offered = api.runtime().store.offered_tools(run_id)
    assert isinstance(offered, dict) and set(offered) == {"ledger", "time"}
    worker.stop()  # a warm shutdown stops the servers the worker started
    c.wait_until("the server to stop with its worker", lambda: not alive(server))


def test_a_worker_killed_mid_call(make_cluster: MakeCluster, servers: set[int]) -> None:
    """Idempotent: called again under the same key. at_most_once: in doubt."""
    c = mcp_cluster(make_cluster, "filesystem")
    workers = [c.worker(), c.worker()]  # single-process workers: one call each
    held = hold(c)
    note_run, send_run = api.start_run("mcp-held-note", "n"), api.start_run("mcp-held-send", "s")
    note_key, send_key = f"{note_run}:1", f"{send_run}:1"
    c.wait_until("both calls under way", lambda: started(c, note_key)() and started(c, send_key)())
    server_of(c, note_key, servers), server_of(c, send_key, servers)
    for worker in workers:
        c.kill(worker)
    held.unlink()
    c.worker()
    (done,) = c.wait_all([note_run])
    assert done.status is RunStatus.COMPLETED, f"{done}\n{c.logs()}"
    ledger = c.ledger()
    assert ledger.calls(note_key) == 2  # the same key both times: the server could dedupe
    c.wait_until(
        "the send in doubt", lambda: api.get_steps(send_run)[1].status is StepStatus.IN_DOUBT
    )
    assert ledger.calls(send_key) == 1
    assert api.get_run(send_run).status is RunStatus.WAITING


def test_the_mcp_server_killed_mid_call(make_cluster: MakeCluster, servers: set[int]) -> None:
    """Started again; the idempotent call retried under its key, the
    at_most_once one in doubt (it may have been made)."""
    c = mcp_cluster(make_cluster, "filesystem")
    c.worker(), c.worker()
    held = hold(c)
    note_run, send_run = api.start_run("mcp-held-note", "n"), api.start_run("mcp-held-send", "s")
    note_key, send_key = f"{note_run}:1", f"{send_run}:1"
    c.wait_until("both calls under way", lambda: started(c, note_key)() and started(c, send_key)())
    for key in (note_key, send_key):
        c.kill_pid(server_of(c, key, servers))
    held.unlink()
    (done,) = c.wait_all([note_run])
    assert done.status is RunStatus.COMPLETED, f"{done}\n{c.logs()}"
    note_step = api.get_steps(note_run)[1]
    assert note_step.status is StepStatus.DONE and note_step.retries == 1
    ledger = c.ledger()
    first, again = ledger.by_key[note_key]
    assert first.end is None and again.end is not None and again.pid != first.pid
    c.wait_until(
        "the send in doubt", lambda: api.get_steps(send_run)[1].status is StepStatus.IN_DOUBT
    )
    assert "connection broke during the call of 'held_send'" in (
        api.get_steps(send_run)[1].error or ""
    )
    assert ledger.calls(send_key) == 1


def test_the_threads_of_a_worker_share_its_one_server(
    make_cluster: MakeCluster, servers: set[int]
) -> None:
    """A threads pool: runs carried at once by several threads of one process
    call through its one session (submitted to its loop), to one server."""
    c = make_cluster("filesystem", HARNESS_IMPORTS=IMPORTS, HARNESS_WORKER_POOL="threads")
    c.worker("--concurrency=4")
    run_ids = c.start("mcp-desk", count=4)
    for run in c.wait_all(run_ids):
        assert run.status is RunStatus.COMPLETED, f"{run}\n{c.logs()}"
    ledger = c.ledger()
    keys = [f"{run_id}:3" for run_id in run_ids]
    assert sorted(ledger.by_key) == sorted(keys) and all(ledger.effects(k) == 1 for k in keys)
    assert len({server_of(c, key, servers) for key in keys}) == 1
