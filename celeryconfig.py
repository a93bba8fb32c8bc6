"""Celery settings, mapped from the harness's environment variables.

Celery imports this module when the ``tasks`` app is first configured.
Every value comes from :class:`harness.settings.Settings`; see README.md.
"""

from harness.settings import REDIS_VISIBILITY_TIMEOUT, Settings

_settings = Settings.from_env()

broker_url = _settings.broker_url
broker_connection_retry_on_startup = True

# The database is the truth; a message only says "look at run X". JSON only.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
task_ignore_result = True

# Ack after the step, requeue if the worker process dies, one message at a time.
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
task_time_limit = _settings.step_time_limit
task_default_queue = "harness"

# Modules that register agents and tools, imported by every worker.
imports = _settings.imports

beat_schedule = {
    "harness-sweep": {"task": "tasks.sweep", "schedule": _settings.sweep_interval},
}

if _settings.uses_filesystem_broker:
    _folder = _settings.broker_dir
    for _sub in ("queue", "processed", "control"):
        (_folder / _sub).mkdir(parents=True, exist_ok=True)
    broker_transport_options = {
        "data_folder_in": str(_folder / "queue"),
        "data_folder_out": str(_folder / "queue"),
        "processed_folder": str(_folder / "processed"),
        "control_folder": str(_folder / "control"),
        "store_processed": False,
        "polling_interval": _settings.broker_poll,
    }
    # Prefork children share one read lock on this transport; a SIGKILLed idle
    # child would freeze the rest. One process per worker: scale with more workers.
    worker_pool = "solo"
elif broker_url.startswith(("redis://", "rediss://")):
    # An unacked message returns only after this; recovery comes from the sweeper.
    broker_transport_options = {"visibility_timeout": REDIS_VISIBILITY_TIMEOUT}
elif broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
    from kombu import Queue

    broker_transport_options = {"confirm_publish": True}
    task_queues = [Queue("harness", queue_arguments={"x-queue-type": "quorum"})]
    worker_detect_quorum_queues = True
