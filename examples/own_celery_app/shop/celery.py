"""The shop's Celery application: its own configuration, and the harness installed.

``celery -A shop`` finds ``app`` here. The harness's tasks go to the queue
``agents`` (and its recovery lane ``agents.recovery``); the shop's own keep
their queue, their serializer and their beat schedule.
"""

from celery import Celery

import harness.celery

app = Celery("shop")
app.config_from_object("shop.config")
harness.celery.install(app, queue="agents")
