"""Runs carried by real `celery -A tasks worker` processes on each broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness import api
from tests.cluster import Cluster

pytestmark = pytest.mark.slow


def test_runs_complete_with_one_effect_per_step(any_cluster: Cluster) -> None:
    any_cluster.worker()
    any_cluster.beat()
    run_ids = any_cluster.start("chain", count=3)
    # re-dispatching runs that are already moving must not start second chains
    rt = api.runtime()
    for run_id in run_ids:
        for cursor in (None, 0, 1):
            rt.dispatch(run_id, cursor)  # type: ignore[arg-type]
    any_cluster.assert_completed_once(run_ids)
    run = api.get_run(run_ids[0])
    assert run.result == "3 effects done" and run.cursor == 7


def test_message_for_a_missing_run_is_dropped(any_cluster: Cluster) -> None:
    worker = any_cluster.worker()
    api.runtime().dispatch("ghost-run", 0)
    any_cluster.wait_until(
        "the drop to be logged", lambda: "run=ghost-run does not exist" in worker.log()
    )
    run_ids = any_cluster.start("chain")
    any_cluster.assert_completed_once(run_ids)


@pytest.mark.postgres
@pytest.mark.redis
def test_a_slow_step_that_went_straight_through_keeps_its_run(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A read_only step skips its RUNNING checkpoint; running 5 s against a 2 s
    lease, its first heartbeat writes the lease, and every renewal after keeps
    the sweeper and the duplicates sent meanwhile away: one call, no takeover."""
    c = make_cluster("redis")
    c.beat()
    c.worker("--concurrency=2")
    (run_id,) = c.start("slow-read")
    c.wait_until("the read under way", lambda: c.ledger().unfinished(c.killed))
    c.wait_until("the lease written by a heartbeat", lambda: api.get_run(run_id).owner is not None)
    for _ in range(3):  # duplicates while it runs: each finds the lease live
        api.runtime().dispatch(run_id, 1)
    ledger = c.assert_completed_once([run_id])
    assert ledger.calls(f"{run_id}:1") == 1
    kinds = [e.to_status for e in api.runtime().store.events(run_id)]
    assert "lease_takeover" not in kinds and "redispatched" not in kinds, kinds
    step = api.get_steps(run_id)[1]
    assert (step.status, step.attempts) == ("done", 1)


@pytest.mark.postgres
@pytest.mark.redis
def test_a_threads_pool_worker_keeps_every_lease(make_cluster: Callable[..., Cluster]) -> None:
    """Twelve steps at once in one process: the connection pool is sized for the
    threads, and renewals have their own, so no lease lapses under a live step."""
    c = make_cluster("redis", HARNESS_WORKER_POOL="threads")
    c.beat()
    worker = c.worker("--concurrency=12")
    run_ids = c.start("slow-chain", count=12)
    c.assert_completed_once(run_ids)
    assert "a pool of 12 database connections for steps" in worker.log()
    kinds = [e.to_status for r in run_ids for e in api.runtime().store.events(r)]
    assert "lease_takeover" not in kinds and "recovered_running" not in kinds
