"""The old path of :mod:`harness.celery.config`, kept for configurations that
import ``harness.worker.celeryconf.celery_settings``: the same functions."""

from harness.celery.config import celery_settings, make_sender

__all__ = ["celery_settings", "make_sender"]
