"""The sweeper does not wait behind the work it should rescue.

Beat sweeps in its own process (harness.celery.sweeper), so a sweep needs no
worker slot and no queue; the runs it re-sends take the recovery lane, which
workers fetch first, so they jump a step queue of 10,000 messages.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from amqp.exceptions import NotFound
from kombu import Connection

from harness import api
from harness.celery.config import QUEUE, RECOVERY_QUEUE, SWEEP_TASK
from harness.engine import probes
from harness.engine.probes import REPROBE
from harness.records import Event, StepStatus
from tests.cluster import LEASE_TTL, SWEEP_INTERVAL, Cluster
from tests.services import RABBITMQ_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BACKLOG = 10_000
#: Allowance for the one hop from the recovery lane to a free slot (measured: ms).
HOP = 5.0


def _template(client: redis.Redis[bytes]) -> dict[str, Any]:
    """A real step message for a run that does not exist, taken off the queue."""
    api.runtime().dispatch("ghost-run", 0)
    raw = client.rpop(QUEUE)
    assert raw is not None and client.llen(QUEUE) == 0
    message: dict[str, Any] = json.loads(raw)
    return message


def _push_backlog(client: redis.Redis[bytes], template: dict[str, Any], count: int) -> None:
    """``count`` copies of ``template``, each its own task, in one round trip per 1,000."""
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        task_id = str(uuid.uuid4())
        message = json.loads(json.dumps(template))
        message["headers"]["id"] = message["headers"]["root_id"] = task_id
        message["properties"]["correlation_id"] = task_id
        message["properties"]["delivery_tag"] = str(uuid.uuid4())
        pipe.lpush(QUEUE, json.dumps(message))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


def _running_again(run_id: str, step: int, after: float) -> Event | None:
    for event in api.runtime().store.events(run_id):
        if event.step_index == step and event.to_status == StepStatus.RUNNING and event.at > after:
            return event
    return None


@pytest.mark.postgres
@pytest.mark.redis
def test_recovery_jumps_a_backlog_while_every_slot_is_busy(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Worker V is in a 20 s tool call; worker A has one slot in another and one
    working through 10,000 queued messages. V is killed: its run is taken up again
    within lease TTL + sweep interval + a hop, long before the backlog is through."""
    c = make_cluster("redis")
    client = redis.Redis.from_url(c.env["HARNESS_BROKER_URL"])
    template = _template(client)
    c.beat()

    def calling(count: int) -> Callable[[], bool]:
        return lambda: sum(e.end is None for e in c.ledger().executions) == count

    victim_worker = c.worker("--concurrency=1")
    [victim] = c.start("stall")
    c.wait_until("V in a long tool call", calling(1))
    c.worker("--concurrency=2")
    [other] = c.start("stall")
    c.wait_until("A in a long tool call", calling(2))
    _push_backlog(client, template, BACKLOG)
    run = api.get_run(victim)
    assert run.owner is not None and f":{victim_worker.children()[0]}:" in run.owner
    c.kill(victim_worker)
    killed_at = time.time()
    run = api.get_run(victim)
    step, expires_at = run.cursor, run.lease_expires_at
    assert expires_at is not None

    found: list[Event] = []
    backlog_left = 0

    def taken_up_again() -> bool:
        nonlocal backlog_left
        event = _running_again(victim, step, killed_at)
        if event is not None:
            found.append(event)
            backlog_left = int(client.llen(QUEUE))
        return event is not None

    c.wait_until("the killed step to run again", taken_up_again, timeout=30)
    recovered = found[0]
    after_expiry = recovered.at - expires_at
    after_kill = recovered.at - killed_at
    resent = next(e for e in api.runtime().store.events(victim) if e.to_status == "redispatched")
    print(
        f"\nre-run {after_kill:.2f}s after the kill, {after_expiry:.2f}s after the lease "
        f"expired, {recovered.at - resent.at:.3f}s after the re-send (bound: TTL "
        f"{LEASE_TTL} + sweep {SWEEP_INTERVAL} + hop); {backlog_left} of {BACKLOG} "
        "backlog messages still queued"
    )
    assert after_expiry <= SWEEP_INTERVAL + HOP, c.logs()
    assert after_kill <= LEASE_TTL + SWEEP_INTERVAL + HOP, c.logs()
    assert backlog_left >= BACKLOG // 5, "the backlog drained first: nothing was jumped"
    assert recovered.worker != run.owner
    other_call = next(s for s in api.get_steps(other) if s.kind == "tool")
    assert c.ledger().calls(other_call.idempotency_key) == 1, "A's long call was repeated"


def _queue_lengths(c: Cluster, broker: str) -> dict[str, int]:
    if broker == "redis":
        client = redis.Redis.from_url(c.env["HARNESS_BROKER_URL"])
        return {q: int(client.llen(q)) for q in (QUEUE, RECOVERY_QUEUE)}
    lengths = {}
    with Connection(RABBITMQ_URL) as conn:
        for queue in (QUEUE, RECOVERY_QUEUE):
            channel = conn.channel()  # a passive declare of a missing queue closes it
            try:
                lengths[queue] = int(channel.queue_declare(queue=queue, passive=True).message_count)
            except NotFound:  # declared on the first message sent to it
                lengths[queue] = 0
    return lengths


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_no_sweep_piles_up_while_no_worker_runs(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    """Beat alone for many sweep intervals: it sweeps in-process and sends no sweep
    message; the only messages are the run's own step, the sweeper's re-sends of
    it (spaced out exponentially), and a delivery probe per lane every two
    lease TTLs at most. A worker then finishes the run."""
    c = make_cluster(broker)
    run_id = c.start("chain")[0]  # no worker: its first message waits
    beat = c.beat()
    outage = 4 * LEASE_TTL  # 16 sweep intervals
    deadline = time.monotonic() + outage
    most = {QUEUE: 0, RECOVERY_QUEUE: 0}
    while time.monotonic() < deadline:
        for queue, length in _queue_lengths(c, broker).items():
            most[queue] = max(most[queue], length)
        time.sleep(SWEEP_INTERVAL / 2)
    resends = [e for e in api.runtime().store.events(run_id) if e.to_status == "redispatched"]
    assert resends, beat.log()  # beat swept, with no worker at all
    assert f"sweeper re-dispatched run={run_id}" in beat.log()
    probes_at_most = 1 + int(outage / (REPROBE * LEASE_TTL))  # one per two TTLs
    assert 2 <= most[QUEUE] <= 1 + probes_at_most  # the step, and the probes
    assert 2 <= most[RECOVERY_QUEUE] <= 3 + probes_at_most, (most, resends)
    assert len(resends) <= 3
    if broker == "redis":
        client = redis.Redis.from_url(c.env["HARNESS_BROKER_URL"])
        queued = [json.loads(m) for q in (QUEUE, RECOVERY_QUEUE) for m in client.lrange(q, 0, -1)]
        assert SWEEP_TASK not in {m["headers"]["task"] for m in queued}
        probed = [m for m in queued if m["headers"]["argsrepr"].startswith("run=harness.probe:")]
        assert 2 <= len(probed) <= 2 * probes_at_most, probed
    c.worker()
    c.assert_completed_once([run_id])


@pytest.mark.postgres
@pytest.mark.rabbitmq
@pytest.mark.redis
def test_a_sweep_sent_on_demand_expires_instead_of_piling_up(
    make_cluster: Callable[..., Cluster],
) -> None:
    """``tasks.sweep`` sent with no worker up (by hand, or by a beat with another
    scheduler) takes the recovery lane and expires after a sweep interval: on
    RabbitMQ the broker drops it, and a worker would discard it unrun."""
    c = make_cluster("rabbitmq", HARNESS_SWEEP_INTERVAL="2")
    import tasks

    for _ in range(5):
        tasks.sweep.delay()
    assert _queue_lengths(c, "rabbitmq")[RECOVERY_QUEUE] == 5
    c.wait_until(
        "the sweeps to expire",
        lambda: _queue_lengths(c, "rabbitmq")[RECOVERY_QUEUE] == 0,
        timeout=10,
    )


@pytest.mark.postgres
@pytest.mark.redis
def test_a_backlog_is_not_fed_duplicates_and_only_lost_messages_are_resent(
    make_cluster: Callable[..., Cluster],
) -> None:
    """200 runs queued on 4 slots wait far longer than their wake-up time (TTL
    4 s). The sweeper re-sends none of them, since their messages are queued
    behind the lane's last delivered probe; five messages taken off the queue
    (lost) are re-sent, and only those: every run completes, each call once."""
    ttl = 4.0  # a run waits for a probe at most 10 TTLs: longer than this backlog lasts
    c = make_cluster("redis", HARNESS_LEASE_TTL=str(ttl))
    client = redis.Redis.from_url(c.env["HARNESS_BROKER_URL"])
    c.worker("--concurrency=4")
    c.beat()
    store = api.runtime().store
    c.wait_until(
        "a probe down each lane to come through",
        lambda: (
            all(lane.delivered_before for lane in store.lanes().values())
            and len(store.lanes()) == 2
        ),
    )
    run_ids = c.start("queued", count=200)
    lost: set[str] = set()
    kept: list[bytes] = []  # the sweeper's probes, sent after the runs: not lost
    while len(lost) < 5:  # the newest messages: far back in the queue
        raw = client.lpop(QUEUE)
        assert raw is not None, "the queue ran out before five run messages were taken"
        run_id = json.loads(raw)["headers"]["argsrepr"].removeprefix("run=")
        if probes.parse(run_id) is None:
            lost.add(run_id)
        else:
            kept.append(raw)
    for raw in reversed(kept):  # back where they were, at the newest end
        client.lpush(QUEUE, raw)
    assert lost <= set(run_ids) and len(lost) == 5
    c.assert_completed_once(run_ids)
    resent = {
        run_id
        for run_id in run_ids
        if any(e.to_status == "redispatched" for e in store.events(run_id))
    }
    took = max(r.updated_at for r in c.wait_all(run_ids)) - min(
        r.created_at for r in c.wait_all(run_ids)
    )
    print(f"\n200 runs on 4 slots in {took:.1f}s (TTL {ttl:g}s); re-sent: {len(resent)}")
    assert took > 2 * ttl, "no backlog outlasted the TTL: the test shows nothing"
    assert resent == lost, c.logs()
    assert api.stats()["stale_writes_rejected"] == 0
