"""SIGKILL real workers mid-step and count side effects from the outside.

Sized for CI: a few runs per test, lease TTL 2 s, sweep every 0.5 s.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from harness import api
from harness.records import RunStatus, StepStatus
from tests.cluster import Cluster

pytestmark = pytest.mark.slow


def _in_flight(c: Cluster) -> dict[str, int]:
    """Keys whose call started and has not ended: {key: pid of the executor}."""
    ledger = c.ledger()
    return {
        key: starts[-1][0]
        for key, starts in ledger.starts.items()
        if len(starts) > len(ledger.ends.get(key, []))
    }


def _wait_in_flight(c: Cluster) -> dict[str, int]:
    c.wait_until("a tool call in flight", lambda: _in_flight(c))
    return _in_flight(c)


def test_pool_child_killed_mid_tool_call(make_cluster: object) -> None:
    c = make_cluster("redis")  # type: ignore[operator]
    c.beat()
    worker = c.worker("--concurrency=2")
    run_ids = c.start("slow-chain", count=2)
    victims = _wait_in_flight(c)
    key, pid = next(iter(victims.items()))
    assert pid in worker.children(), "the tool should run in a pool child"
    os.kill(pid, signal.SIGKILL)
    c.assert_completed_once(run_ids, killed={key})
    ledger = c.ledger()
    assert len(ledger.starts[key]) == 2 and ledger.effects(key) == 1
    run_id, index = key.rsplit(":", 1)
    step = api.get_steps(run_id)[int(index)]
    assert step.attempts == 2 and step.status is StepStatus.DONE
    assert worker.proc.poll() is None, "the worker survives its child"


@pytest.mark.parametrize("broker", ["redis", "filesystem"])
def test_whole_worker_killed_mid_tool_call(make_cluster: object, broker: str) -> None:
    c = make_cluster(broker)  # type: ignore[operator]
    c.beat()
    first = c.worker()
    run_ids = c.start("slow-chain", count=2)
    killed = set(_wait_in_flight(c))
    first.kill()
    killed_at = time.monotonic()
    for key in killed:
        run = api.get_run(key.rsplit(":", 1)[0])
        assert run.current is not None and run.current.status is StepStatus.RUNNING
    c.worker()
    c.assert_completed_once(run_ids, killed=killed)
    print(f"{broker}: every run completed {time.monotonic() - killed_at:.1f}s after the kill")
    stats = api.stats()
    assert stats["recovered_running_steps"] == stats["lease_takeovers"] == len(killed), stats
    # the killed worker also took another run's next message with it, at times
    assert isinstance(stats["sweeper_redispatches"], int)
    assert stats["sweeper_redispatches"] >= len(killed), stats


def test_embedded_workers_have_no_child_to_freeze_on(make_cluster: object) -> None:
    """kombu's filesystem transport freezes prefork pools when an idle child is
    killed; the embedded default runs single-process workers instead. Kill one
    whole idle worker: the other carries the runs."""
    c = make_cluster("filesystem")  # type: ignore[operator]
    c.beat()
    doomed, survivor = c.worker(), c.worker()
    assert doomed.children() == [] and survivor.children() == []
    doomed.kill()
    c.assert_completed_once(c.start("chain", count=3))


@pytest.mark.parametrize("broker", ["redis", "filesystem"])
def test_racing_workers_never_run_one_step_twice_at_once(make_cluster: object, broker: str) -> None:
    c = make_cluster(broker)  # type: ignore[operator]
    c.beat()
    c.worker()
    c.worker()
    run_ids = c.start("long-chain", count=6)
    rt = api.runtime()
    stop = threading.Event()

    def spam() -> None:  # duplicate and stale messages, as a flaky client would send
        while not stop.wait(0.02):
            for run_id in run_ids:
                rt.dispatch(run_id, None)  # type: ignore[arg-type]

    spammer = threading.Thread(target=spam)
    spammer.start()
    try:
        c.wait_all(run_ids)
    finally:
        stop.set()
        spammer.join()
    c.assert_completed_once(run_ids)


def test_at_most_once_call_in_doubt_is_not_repeated(make_cluster: object) -> None:
    c = make_cluster("redis")  # type: ignore[operator]
    c.beat()
    first = c.worker()
    (run_id,) = c.start("mailer")
    (key,) = _wait_in_flight(c)
    first.kill()
    c.worker()
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.WAITING
    step = api.get_steps(run_id)[1]
    assert step.status is StepStatus.IN_DOUBT
    ledger = c.ledger()
    assert len(ledger.starts[key]) == 1 and ledger.effects(key) == 0
    assert api.stats()["in_doubt_steps"] == 1
    # the operator checked the mail server: it was sent
    api.resolve_run(run_id, "succeeded", "sent, per the mail server's log")
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.COMPLETED
    assert api.get_steps(run_id)[1].result == "sent, per the mail server's log"
    assert len(c.ledger().starts[key]) == 1
