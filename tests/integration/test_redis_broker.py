"""The Redis broker transport (harness.celery.redisbroker) against a real Redis.

After a broker connection is lost Celery closes it, and a late ack of a step
that ran through the outage still goes to the closed connection's channel.
kombu's Redis channel then fails with an AttributeError, which Celery does not
handle: the worker stopped. Here the same ack fails as a connection error,
logged ("Couldn't ack"), and the worker carries on.
"""

from __future__ import annotations

import logging
import threading

import pytest
from kombu import Connection
from kombu.message import Message

from harness.celery.config import celery_settings
from harness.settings import Settings
from tests.services import REDIS_URL, require

TRANSPORT = "harness.celery.redisbroker:Transport"
log = logging.getLogger(__name__)


@pytest.fixture
def broker_url() -> str:
    require("redis")
    return f"{REDIS_URL}/15"


def _ack_after_close(url: str, transport: str) -> None:
    conn = Connection(url, transport=transport)
    channel = conn.channel()
    errors = conn.connection_errors  # what Celery's Request hands to ack_log_error
    message = Message(channel=channel, delivery_tag="late-ack", body=b"{}")
    conn.close()  # the consumer's reconnect closes the old connection
    message.ack_log_error(log, errors)


@pytest.mark.redis
def test_kombu_fails_a_late_ack_with_an_attribute_error(broker_url: str) -> None:
    """The upstream defect; when this fails, kombu fixed it and the workaround can go."""
    with pytest.raises(AttributeError):
        _ack_after_close(broker_url, "redis")


@pytest.mark.redis
def test_a_late_ack_on_a_closed_connection_is_a_logged_connection_error(
    broker_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _ack_after_close(broker_url, TRANSPORT)
    assert "Couldn't ack 'late-ack'" in caplog.text


@pytest.mark.redis
def test_a_detached_transport_raises_a_connection_error(broker_url: str) -> None:
    """The issue's own message: the channel still has its transport, the transport
    lost its client (kombu.Connection._do_close_transport)."""
    with Connection(broker_url, transport=TRANSPORT) as conn:
        channel = conn.channel()
        errors = conn.connection_errors
        client = conn.transport.client
        conn.transport.client = None
        try:
            with pytest.raises(errors):
                channel._connparams()
        finally:
            conn.transport.client = client


def test_redis_brokers_use_it() -> None:
    conf = celery_settings(Settings.from_env({"HARNESS_BROKER_URL": "redis://r:6379/0"}))
    assert conf["broker_transport"] == TRANSPORT
    tls = celery_settings(Settings.from_env({"HARNESS_BROKER_URL": "rediss://r:6380/0"}))
    assert "broker_transport" not in tls  # kombu enables TLS by the scheme's name


@pytest.mark.redis
def test_a_channel_keeps_one_client_per_pool_and_acks_from_many_threads(broker_url: str) -> None:
    """kombu builds a redis-py client per ack; this channel reuses one, also across
    threads (a threads pool acks from its step threads), and makes a new one with
    a new pool. Every message taken and acked from 8 threads leaves the unacked set."""
    with Connection(broker_url, transport=TRANSPORT) as conn:
        channel = conn.channel()
        first = channel._create_client()
        assert channel._create_client() is first
        assert channel._create_client(asynchronous=True) is not first
        queue = conn.SimpleQueue("harness-test-acks")
        queue.clear()
        for i in range(80):
            queue.put({"i": i})
        messages = [queue.get(timeout=5) for _ in range(80)]
        unacked = channel.unacked_key
        assert channel._create_client().hlen(unacked) == 80

        def ack(part: list[Message]) -> None:
            for message in part:
                message.ack()

        threads = [threading.Thread(target=ack, args=(messages[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(m.payload["i"] for m in messages) == list(range(80))
        assert channel._create_client().hlen(unacked) == 0
        queue.close()
        channel._disconnect_pools()  # as kombu does when it closes a channel's pools
        assert channel._create_client() is not first
