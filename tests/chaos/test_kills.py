"""SIGKILL real workers mid-step and count side effects from the outside.

Sized for CI: a few runs per test, lease TTL 2 s, sweep every 0.5 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from harness import api
from harness.records import RunStatus, StepStatus
from tests.cluster import Cluster

pytestmark = pytest.mark.slow


def _call_under_way(c: Cluster) -> tuple[str, int]:
    """Wait for a tool call in progress; return its key and the pid running it."""
    c.wait_until("a tool call under way", lambda: c.ledger().unfinished(c.killed))
    return next(iter(c.ledger().unfinished(c.killed).items()))


@pytest.mark.postgres
@pytest.mark.redis
def test_pool_child_killed_mid_tool_call(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster("redis")
    c.beat()
    worker = c.worker("--concurrency=2")
    run_ids = c.start("slow-chain", count=2)
    key, pid = _call_under_way(c)
    assert pid in worker.children(), "the tool should run in a pool child"
    c.kill_pid(pid)
    ledger = c.assert_completed_once(run_ids)
    assert ledger.calls(key) == 2 and ledger.effects(key) == 1
    run_id, index = key.rsplit(":", 1)
    step = api.get_steps(run_id)[int(index)]
    assert step.attempts == 2 and step.status is StepStatus.DONE
    assert worker.proc.poll() is None, "the worker survives its child"


@pytest.mark.parametrize("broker", ["redis", "filesystem"])
def test_whole_worker_killed_mid_tool_call(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    c = make_cluster(broker)
    c.beat()
    # one process executes, so exactly the calls under way at the kill are cut off
    first = c.worker("--concurrency=1")
    run_ids = c.start("slow-chain", count=2)
    _call_under_way(c)
    c.kill(first)
    killed_at = time.monotonic()
    cut_off = [e.key for e in c.ledger().executions if e.end is None]
    assert len(cut_off) == 1
    run = api.get_run(cut_off[0].rsplit(":", 1)[0])
    assert run.current is not None and run.current.status is StepStatus.RUNNING
    c.worker()
    ledger = c.assert_completed_once(run_ids)
    assert ledger.calls(cut_off[0]) == 2
    print(f"{broker}: every run completed {time.monotonic() - killed_at:.1f}s after the kill")
    stats = api.stats()
    assert stats["recovered_running_steps"] == stats["lease_takeovers"] == 1, stats
    # the killed worker may also have taken another run's next message with it
    assert stats["sweeper_redispatches"] >= 1, stats


def test_embedded_workers_have_no_child_to_freeze_on(make_cluster: Callable[..., Cluster]) -> None:
    """kombu's filesystem transport freezes prefork pools when an idle child is
    killed; the embedded default runs single-process workers instead. Kill one
    whole idle worker: the other carries the runs."""
    c = make_cluster("filesystem")
    c.beat()
    doomed, survivor = c.worker(), c.worker()
    assert doomed.children() == [] and survivor.children() == []
    c.kill(doomed)
    c.assert_completed_once(c.start("chain", count=3))


@pytest.mark.parametrize("broker", ["redis", "filesystem"])
def test_racing_workers_never_run_one_step_twice_at_once(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    c = make_cluster(broker)
    c.beat()
    c.worker()
    c.worker()
    (slow,) = c.start("slow-chain")
    run_ids = [slow, *c.start("long-chain", count=6)]
    rt = api.runtime()

    def dropped() -> int:
        return sum(p.log().count("duplicate message dropped") for p in c.processes)

    # A duplicate that surely overlaps: sent while a 2 s call is under way, it
    # reaches the idle worker, which finds the lease live and drops it.
    c.wait_until(
        "the slow call under way",
        lambda: any(key.startswith(slow) for key in c.ledger().unfinished(c.killed)),
    )
    rt.dispatch(slow, api.get_run(slow).cursor)
    c.wait_until("a duplicate dropped mid-step", lambda: dropped() >= 1)
    # Then duplicates, as a flaky client would send, until the runs are done.
    while not all(api.get_run(r).status.terminal for r in run_ids):
        for run_id in run_ids:
            rt.dispatch(run_id, None)  # type: ignore[arg-type]
        time.sleep(0.02)
    ledger = c.assert_completed_once(run_ids)
    assert all(ledger.calls(k) == 1 for k in ledger.by_key), "nothing was killed"


@pytest.mark.postgres
@pytest.mark.redis
def test_at_most_once_call_in_doubt_is_not_repeated(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster("redis")
    c.beat()
    first = c.worker()
    (run_id,) = c.start("mailer")
    key, _ = _call_under_way(c)
    c.kill(first)
    c.worker()
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.WAITING
    step = api.get_steps(run_id)[1]
    assert step.status is StepStatus.IN_DOUBT
    assert c.ledger().calls(key) == 1 and c.ledger().effects(key) == 0
    assert api.stats()["in_doubt_steps"] == 1
    # the operator checked the mail server: it was sent
    api.resolve_run(run_id, "succeeded", "sent, per the mail server's log")
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.COMPLETED
    assert api.get_steps(run_id)[1].result == "sent, per the mail server's log"
    assert c.ledger().calls(key) == 1
