"""The shop's own Celery settings, read by ``app.config_from_object``.

Nothing here is about the harness: it has its own ``HARNESS_*`` variables.
For ``harness start`` and ``harness serve`` (which never import this app)
to send where these workers listen, set ``HARNESS_BROKER_URL`` to the same
broker as ``SHOP_BROKER_URL`` and ``HARNESS_QUEUE=agents``.
"""

import os

broker_url = os.environ.get("SHOP_BROKER_URL", "redis://localhost:6379/0")
result_backend = os.environ.get("SHOP_RESULT_BACKEND", "redis://localhost:6379/1")

# The shop's own serializer. JSON: Celery refuses to start a worker that
# accepts pickle under root (a container's default user). Whatever an app
# chooses here, pickle included, the harness's messages stay JSON and
# `install` keeps "json" accepted.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]

task_default_queue = "shop"
task_routes = {"shop.tasks.*": {"queue": "shop"}}
imports = ("shop.tasks",)

beat_schedule = {
    "shop-restock": {
        "task": "shop.tasks.restock",
        "schedule": float(os.environ.get("SHOP_RESTOCK_EVERY", "60")),
    },
}
