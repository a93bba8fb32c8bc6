"""Celery settings, mapped from the harness's environment variables.

Celery imports this module when the ``tasks`` app is first configured; every
value comes from :class:`harness.settings.Settings` (see README.md).
``settings_for`` is also used to build a sender for other configurations.
"""

from typing import Any

from kombu import Queue

from harness.settings import REDIS_VISIBILITY_TIMEOUT, Settings

QUEUE = "harness"


def settings_for(s: Settings) -> dict[str, Any]:
    """The Celery configuration for one set of harness settings."""
    conf: dict[str, Any] = {
        "broker_url": s.broker_url,
        "broker_connection_retry_on_startup": True,
        # The database is the truth; a message only says "look at run X". JSON only.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        # Ack after the step, requeue if the worker process dies, one message at a time.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": s.step_time_limit,
        "task_default_queue": QUEUE,
        # Modules that register agents and tools, imported by every worker.
        "imports": s.imports,
        "beat_schedule": {
            "harness-sweep": {"task": "tasks.sweep", "schedule": s.sweep_interval},
        },
    }
    if s.uses_filesystem_broker:
        folder = s.broker_dir
        for sub in ("queue", "staging", "claimed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        # kombu's filesystem transport with atomic publish and claim (harness.worker.fsbroker).
        conf["broker_transport"] = "harness.worker.fsbroker:Transport"
        conf["broker_transport_options"] = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "staging_folder": str(folder / "staging"),
            "claim_folder": str(folder / "claimed"),
            "control_folder": str(folder / "control"),
            "polling_interval": s.broker_poll,
        }
        # Prefork children share one read lock on this transport; a SIGKILLed idle
        # child would freeze the rest. One process per worker: scale with more workers.
        conf["worker_pool"] = "solo"
    elif s.broker_url.startswith(("redis://", "rediss://")):
        # An unacked message returns only after this; recovery comes from the sweeper.
        conf["broker_transport_options"] = {"visibility_timeout": REDIS_VISIBILITY_TIMEOUT}
    elif s.broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        conf["broker_transport_options"] = {"confirm_publish": True}
        conf["task_queues"] = [Queue(QUEUE, queue_arguments={"x-queue-type": "quorum"})]
        conf["worker_detect_quorum_queues"] = True
    if s.worker_pool is not None:
        # Celery lets a configured pool override `--pool prefork` (its CLI default).
        conf["worker_pool"] = s.worker_pool
    return conf


globals().update(settings_for(Settings.from_env()))
