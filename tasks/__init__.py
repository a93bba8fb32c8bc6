"""The ready Celery application: the harness installed on an app of its own.

celery -A tasks worker     # carry runs forward (the step queue and the recovery lane)
celery -A tasks beat       # the recovery sweeper: it sweeps in its own process
celery -A tasks flower     # task-level monitoring

Importing this module reads no variable and creates nothing: Celery asks
``celeryconfig`` for the configuration when it first needs it. The library
never imports this module; :func:`harness.celery.install` registers the tasks
and hands the library this app's sender. An application of your own calls
``install`` the same way (``harness.celery``).
"""

from __future__ import annotations

from celery import Celery

import celeryconfig
from harness.celery import install

app = Celery("tasks")
# A promise: Celery calls it when the configuration is first read, not at import.
app.add_defaults(celeryconfig.from_env)

# The step queue is HARNESS_QUEUE's; the broker, HARNESS_BROKER_URL's.
harness_tasks = install(app, broker_from_settings=True)
#: ``tasks.run_step.delay(run_id)`` moves a run; ``tasks.sweep.delay()`` sweeps once.
run_step = harness_tasks.run_step
sweep = harness_tasks.sweep
#: Builds this app's sender for a set of settings (``harness.api.use_sender``).
sender = harness_tasks.sender
