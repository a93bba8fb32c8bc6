"""The Redis broker transport (harness.worker.redisbroker) against a real Redis.

After a broker connection is lost Celery closes it, and a late ack of a step
that ran through the outage still goes to the closed connection's channel.
kombu's Redis channel then fails with an AttributeError, which Celery does not
handle: the worker stopped. Here the same ack fails as a connection error,
logged ("Couldn't ack"), and the worker carries on.
"""

from __future__ import annotations

import logging

import pytest
from kombu import Connection
from kombu.message import Message

from harness.settings import Settings
from harness.worker.celeryconf import celery_settings
from tests.services import REDIS_URL, require

TRANSPORT = "harness.worker.redisbroker:Transport"
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


def test_kombu_fails_a_late_ack_with_an_attribute_error(broker_url: str) -> None:
    """The upstream defect; when this fails, kombu fixed it and the workaround can go."""
    with pytest.raises(AttributeError):
        _ack_after_close(broker_url, "redis")


def test_a_late_ack_on_a_closed_connection_is_a_logged_connection_error(
    broker_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _ack_after_close(broker_url, TRANSPORT)
    assert "Couldn't ack 'late-ack'" in caplog.text


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
