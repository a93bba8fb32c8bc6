"""The old path of :mod:`harness.celery.fsbroker`, kept for configurations whose
``broker_transport`` is ``harness.worker.fsbroker:Transport``: the same transport."""

from harness.celery.fsbroker import Channel, Transport

__all__ = ["Channel", "Transport"]
