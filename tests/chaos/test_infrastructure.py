"""Infrastructure faults: Redis, PostgreSQL and RabbitMQ restarted mid-run, and
broker messages purged. Side effects are counted in the external ledger."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from kombu import Connection

from harness import api
from tests.cluster import Cluster
from tests.services import RABBITMQ_URL, restart

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _some_steps_done(c: Cluster, count: int = 2) -> None:
    def done() -> bool:
        return sum(e.end is not None for e in c.ledger().executions) >= count

    c.wait_until(f"{count} tool effects", done)


def _restart_mid_run(c: Cluster, service: str) -> list[str]:
    """Runs under way on a worker and a beat, then ``service`` restarted under them."""
    c.beat()
    c.worker("--concurrency=2")
    run_ids = c.start("slow-chain", count=4)
    _some_steps_done(c)
    restart(service)
    return run_ids


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.restarts
def test_redis_restart_loses_broker_and_cache_but_no_run(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Redis here keeps nothing on disk: queued messages and cached results vanish.
    The sweeper re-sends the runs; the SQL record still stops stored calls repeating."""
    c = make_cluster("redis", HARNESS_LEASE_TTL="4")
    ledger = c.assert_completed_once(_restart_mid_run(c, "redis"))
    # Nothing was killed: the calls under way kept their leases (in PostgreSQL).
    assert {key: ledger.calls(key) for key in ledger.by_key} == dict.fromkeys(ledger.by_key, 1)


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.restarts
def test_postgres_restart_mid_run(make_cluster: Callable[..., Cluster]) -> None:
    """Workers reconnect: a write that hits the dead connection is retried on a new
    one, for as long as the lease holds; nothing is lost or repeated."""
    # A lease outlives the restart (about 3 s here), as it should in production:
    # an outage longer than the lease hands the step to another worker.
    c = make_cluster("redis", HARNESS_LEASE_TTL="15")
    run_ids = _restart_mid_run(c, "postgres")
    api.reset_runtime()  # this test process's own pool died with the server
    ledger = c.assert_completed_once(run_ids)
    # Nothing was killed, and the outage was shorter than the lease: one call each.
    assert {key: ledger.calls(key) for key in ledger.by_key} == dict.fromkeys(ledger.by_key, 1)


@pytest.mark.postgres
@pytest.mark.rabbitmq
@pytest.mark.redis
@pytest.mark.restarts
def test_rabbitmq_restart_mid_run(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster("rabbitmq", HARNESS_LEASE_TTL="4")
    c.assert_completed_once(_restart_mid_run(c, "rabbitmq"))


def _purge(broker: str, c: Cluster) -> int:
    if broker == "redis":
        client = redis.Redis.from_url(c.env["HARNESS_BROKER_URL"])
        queued = int(client.llen("harness"))
        client.delete("harness")
        return queued
    if broker == "rabbitmq":
        with Connection(RABBITMQ_URL) as conn:
            return int(conn.default_channel.queue_purge("harness") or 0)
    queue = Path(c.env["HARNESS_HOME"]) / "broker" / "queue"
    purged = 0
    for message in queue.glob("*.msg"):
        message.unlink(missing_ok=True)
        purged += 1
    return purged


@pytest.mark.parametrize("broker", ["filesystem", "redis", "rabbitmq"])
def test_purged_messages_are_recovered_by_the_sweeper(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    c = make_cluster(broker)
    run_ids = c.start("chain", count=5)  # no worker yet: every first message is queued
    assert _purge(broker, c) == len(run_ids)
    c.beat()
    c.worker(*(("--concurrency=2",) if broker != "filesystem" else ()))
    c.assert_completed_once(run_ids)
    for run_id in run_ids:
        kinds = [e.to_status for e in api.runtime().store.events(run_id)]
        assert "redispatched" in kinds, os.linesep + c.logs()
