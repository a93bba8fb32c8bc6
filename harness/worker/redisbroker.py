"""The old path of :mod:`harness.celery.redisbroker`, kept for configurations whose
``broker_transport`` is ``harness.worker.redisbroker:Transport``: the same transport."""

from harness.celery.redisbroker import Channel, Transport

__all__ = ["Channel", "Transport"]
