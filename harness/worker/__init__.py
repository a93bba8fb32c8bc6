"""The old home of the Celery layer, now :mod:`harness.celery`, kept for existing configurations.

Configurations and deployments written before the move name some of its
objects by dotted path: beat's scheduler (``harness.worker.sweeper:Scheduler``,
``InProcessSweep``), the broker transports (``harness.worker.fsbroker:Transport``,
``harness.worker.redisbroker:Transport``), ``harness.worker.celeryconf.celery_settings``
and ``harness.worker.tracing.instrument``. Each of those modules here
re-exports the same objects from its new module; new code imports
:mod:`harness.celery` and its modules.
"""
