"""The shop's own Celery settings, read by ``app.config_from_object``.

Nothing here is about the harness: it has its own ``HARNESS_*`` variables.
For ``harness start`` and ``harness serve`` (which never import this app)
to send where these workers listen, set ``HARNESS_BROKER_URL`` to the same
broker and ``HARNESS_QUEUE=agents``.
"""

import os

broker_url = os.environ.get("SHOP_BROKER_URL", "redis://localhost:6379/0")
result_backend = os.environ.get("SHOP_RESULT_BACKEND", "redis://localhost:6379/1")

# The shop's tasks pass Python objects around: pickle, for its own tasks only.
# (The harness's messages stay JSON; `install` keeps "json" accepted.)
task_serializer = "pickle"
result_serializer = "pickle"
accept_content = ["pickle", "json"]
result_accept_content = ["pickle", "json"]

task_default_queue = "shop"
task_routes = {"shop.tasks.*": {"queue": "shop"}}
imports = ("shop.tasks",)

beat_schedule = {
    "shop-restock": {
        "task": "shop.tasks.restock",
        "schedule": float(os.environ.get("SHOP_RESTOCK_EVERY", "60")),
    },
}
