"""kombu's Redis transport, failing like a lost connection once it is closed.

The defect (celery 5.7.0, kombu 5.7.0, redis-py 8.1.0; no release fixes it,
so there is nothing to pin): when Celery's consumer loses the broker it
closes the old kombu ``Connection``
(``celery/worker/consumer/consumer.py``, ``on_connection_error_after_connected``:
``connection.collect()``, then ``connection.close()``), and kombu detaches the
transport from it (``kombu/connection.py``, ``_do_close_transport``:
``self._transport.client = None``). The old *channels* stay reachable: a late
ack (``task_acks_late``) of a step that ran through the outage goes to
``message.channel``, the old channel, and so does a close that has to be
retried. Such a call needs a Redis client; if the channel's pool was
dropped (``Channel.close`` calls ``_disconnect_pools``), kombu builds a new
one from ``Channel._connparams``, which reads ``self.connection.client.hostname``
(``kombu/transport/redis.py``, ``_connparams``) and raises
``AttributeError: 'NoneType' object has no attribute 'hostname'``. Celery
handles only *connection* errors there (``Message.ack_log_error``,
``Connection.maybe_close_channel``), so the AttributeError escapes the event
loop, the consumer's restart logic does not apply to it ("Unrecoverable
error") and the worker stops consuming.

The workaround: :class:`Channel` raises redis-py's ``ConnectionError`` instead,
which kombu lists among the transport's connection errors. The ack or close
then fails the way it fails while Redis is down: logged ("Couldn't ack"), the
worker carries on over its new connection. The unacked message is not lost
and not needed: the run's state is in the database, and the sweeper re-sends
what should be moving (a duplicate step message is dropped as stale).

One more change, for speed: kombu builds a new redis-py client for every ack,
and for every message a worker takes (``Channel.conn_or_acquire``), and a
client's constructor copies its table of response callbacks: about a millisecond
per step, an eighth of a threads-pool worker's time (py-spy, bench.waiting).
:class:`Channel` keeps one synchronous client per connection pool instead.
redis-py clients are safe to share between threads (a command takes a
connection from the pool for its duration; each pipeline is its own object).

Used for ``redis://`` brokers (``harness.celery.config``). ``rediss://``
keeps kombu's own transport: kombu turns TLS on by that scheme's name.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger(__name__)


class Channel(kombu_redis.Channel):
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool  # a new one after kombu dropped the old (a lost connection)
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client(asynchronous=False)  # type: ignore[misc]
        return client

    def _disconnect_pools(self) -> None:
        self._sync_client = None  # let the dropped pool go with it
        super()._disconnect_pools()  # type: ignore[misc]

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            log.warning("redis broker: a call on a channel of a closed connection (ignored)")
            raise RedisConnectionError("this channel's broker connection was closed")
        params: dict[str, Any] = super()._connparams(asynchronous)  # type: ignore[misc]
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel
