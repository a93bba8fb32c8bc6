"""The old path of :mod:`harness.celery.tracing`, kept for apps that call
``harness.worker.tracing.instrument(app, settings)``: the same function."""

from harness.celery.tracing import instrument

__all__ = ["instrument"]
