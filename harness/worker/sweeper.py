"""The old path of :mod:`harness.celery.sweeper`, kept for configurations that
name beat's scheduler ``harness.worker.sweeper:Scheduler`` (or mix in
``InProcessSweep``): the same classes."""

from harness.celery.sweeper import InProcessSweep, Scheduler

__all__ = ["InProcessSweep", "Scheduler"]
