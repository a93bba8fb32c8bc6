"""The Celery side of the settings: the configuration, the queues, a sender.

:func:`celery_settings` maps one :class:`Settings` to Celery's configuration
and does nothing else: no folder is created (the embedded broker's transport
makes its folders when it connects) and no variable is read. The ``tasks``
app takes it lazily (``celeryconfig``); :func:`make_sender` builds a client
on it for processes that run no Celery app (the CLI, ``harness.start_run``).
An application of your own takes only the queues, routes and tasks
(:func:`harness.celery.install`).

Two queues, both consumed by every worker of the ``tasks`` app (no ``-Q``
needed):

* the step queue (``HARNESS_QUEUE``, default :data:`QUEUE`): every step message;
* its recovery lane (:func:`recovery_lane`, default :data:`RECOVERY_QUEUE`):
  steps re-sent by the sweeper (and an on-demand ``tasks.sweep``). A re-sent
  run has already waited a lease TTL and a sweep; behind a backlog of 10,000
  step messages it would wait again. Workers fetch from this lane first
  (Redis: ``priority`` queue order; the other brokers alternate between the
  queues), so a re-sent step takes the next free slot.

A step message carries the run id and the cursor, nothing else (the database
holds the rest), and says so in Flower: its ``argsrepr`` and ``kwargsrepr``
read ``run=<id>`` and ``cursor=<n>`` (:func:`step_options`). The sweeper's
delivery probes travel the same queues, as the same message, under a task
name of their own (:data:`PROBE_TASK`), so a Flower search can leave them out.

Celery and kombu are imported by the two functions that build their
objects (:func:`declare_queues`, :func:`make_sender`), not by this module:
``harness start`` and ``harness.start_run`` load them to send a message,
``harness show`` and ``import harness`` never do.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.engine import probes
from harness.engine.hints import ClaimHint
from harness.engine.runtime import Sender
from harness.settings import DEFAULT_QUEUE, REDIS_VISIBILITY_TIMEOUT, Settings

if TYPE_CHECKING:
    from celery import Celery
    from kombu import Queue


def recovery_lane(queue: str) -> str:
    """The recovery lane next to the step queue ``queue``."""
    return f"{queue}.recovery"


#: The default step queue (``HARNESS_QUEUE``).
QUEUE = DEFAULT_QUEUE
#: Its recovery lane: steps re-sent by the sweeper jump the step queue's backlog.
RECOVERY_QUEUE = recovery_lane(QUEUE)
#: Task names, as :func:`harness.celery.install` registers them on any app;
#: senders use the names, not the module. They keep the ``tasks.`` prefix of
#: the first release: a message names its task, and one already queued in a
#: deployment must still find it after an upgrade.
STEP_TASK = "tasks.run_step"
SWEEP_TASK = "tasks.sweep"
#: The sweeper's delivery probes (harness.engine.probes): a step message in all
#: but its name, so that Flower can tell them apart (search ``name:run_step``).
PROBE_TASK = "tasks.probe"
#: The longest wait for a provider sent as a delayed step message (sends_delayed).
MAX_COUNTDOWN = 60.0
#: Beat's scheduler: it runs the sweep in its own process (harness.celery.sweeper).
SCHEDULER = "harness.celery.sweeper:Scheduler"


def declare_queues(queue: str, broker_url: str) -> list[Queue]:
    """The step queue ``queue`` and its recovery lane, recovery lane first: on
    Redis that order is the order of fetching."""
    from kombu import Exchange, Queue

    # RabbitMQ: replicated, durable queues (RabbitMQ 4 rejects global QoS on them).
    arguments = {"x-queue-type": "quorum"} if is_amqp(broker_url) else None
    return [
        Queue(name, Exchange(name, type="direct"), routing_key=name, queue_arguments=arguments)
        for name in (recovery_lane(queue), queue)
    ]


def is_amqp(broker_url: str) -> bool:
    """Is this a RabbitMQ broker (quorum queues, publisher confirms, no delayed steps)?"""
    return broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))


def celery_settings(s: Settings) -> dict[str, Any]:
    """The Celery configuration for one set of harness settings. No side effects."""
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
        "task_time_limit": s.task_time_limit,
        "task_default_queue": s.queue,
        "task_queues": declare_queues(s.queue, s.broker_url),
        # An on-demand sweep takes the recovery lane, and is dropped unrun once the
        # next one is due: sweeps never pile up behind a backlog or an outage.
        "task_routes": {SWEEP_TASK: {"queue": recovery_lane(s.queue)}},
        "task_annotations": {SWEEP_TASK: {"expires": s.sweep_interval}},
        # Modules that register agents and tools, imported by every worker.
        "imports": s.imports,
        # Beat sweeps in its own process on this schedule; it sends no sweep message.
        "beat_scheduler": SCHEDULER,
        "beat_schedule": {
            "harness-sweep": {"task": SWEEP_TASK, "schedule": s.sweep_interval},
        },
    }
    conf.update(_transport_settings(s))
    if s.worker_pool is not None:
        # Celery lets a configured pool override `--pool prefork` (its CLI default).
        conf["worker_pool"] = s.worker_pool
    return conf


def _transport_settings(s: Settings) -> dict[str, Any]:
    """What the broker in use needs besides the common configuration: its
    transport (ours where kombu's needed a fix), its options, and the pool
    the filesystem broker allows."""
    out: dict[str, Any] = {}
    if s.uses_filesystem_broker:
        folder = s.broker_dir
        # kombu's filesystem transport with atomic publish and claim (harness.celery.fsbroker).
        out["broker_transport"] = "harness.celery.fsbroker:Transport"
        out["broker_transport_options"] = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "staging_folder": str(folder / "staging"),
            "claim_folder": str(folder / "claimed"),
            "control_folder": str(folder / "control"),
            "polling_interval": s.broker_poll,
        }
        # Prefork children share one read lock on this transport; a SIGKILLed idle
        # child would freeze the rest. One process per worker: scale with more workers.
        out["worker_pool"] = "solo"
    elif s.broker_url.startswith(("redis://", "rediss://")):
        out["broker_transport_options"] = {
            # An unacked message returns only after this; recovery comes from the sweeper.
            "visibility_timeout": REDIS_VISIBILITY_TIMEOUT,
            # Fetch in the order of task_queues: the recovery lane first.
            "queue_order_strategy": "priority",
        }
        if s.broker_url.startswith("redis://"):
            # kombu's transport, except that a channel of a connection lost in a
            # Redis restart fails a late ack with a connection error, not the
            # AttributeError that stopped the worker (harness.celery.redisbroker).
            # Not worker_cancel_long_running_tasks_on_connection_loss: it would kill
            # the steps running through the outage, and their rejects would take
            # the same path to the closed channel.
            out["broker_transport"] = "harness.celery.redisbroker:Transport"
    elif is_amqp(s.broker_url):
        out["broker_transport_options"] = {"confirm_publish": True}
        out["worker_detect_quorum_queues"] = True
    return out


def sends_delayed(broker_url: str, delay: float) -> bool:
    """Is a step that waits ``delay`` seconds for its provider sent a delayed
    message, or woken by the sweeper alone (its ``wake_at`` is in SQL either
    way)? A delayed message is held by the worker that fetched it until it is
    due: fine for a short wait on Redis or the embedded broker. Not for a long
    one (it would outlive Redis's visibility timeout, RabbitMQ's consumer
    timeout), nor on RabbitMQ at all, where with quorum queues each held
    message takes one of the worker's fixed prefetch slots: a storm of rate
    limited steps would idle the worker. The sweeper wakes those instead,
    within a sweep interval of their time. ``broker_url`` is the broker the
    message goes to."""
    return delay <= MAX_COUNTDOWN and not is_amqp(broker_url)


def step_options(
    run_id: str,
    cursor: int,
    queue: str,
    *,
    recovery: bool = False,
    delay: float = 0.0,
    hint: ClaimHint | None = None,
) -> dict[str, Any]:
    """Publishing options of the step message ``(run_id,), {"cursor": cursor}``.

    The step queue ``queue``, or its recovery lane for a re-send; a countdown
    for a step that waits for its provider (see :func:`sends_delayed`); JSON
    whatever the sending app's ``task_serializer``; and what Flower and the
    worker's events show for the arguments, the run and the cursor; and the
    :class:`~harness.engine.hints.ClaimHint`, in a header of its own.
    """
    options: dict[str, Any] = {
        "queue": recovery_lane(queue) if recovery else queue,
        "serializer": "json",
        "argsrepr": f"run={run_id}",
        "kwargsrepr": f"cursor={cursor}" + (" (recovery)" if recovery else ""),
    }
    if delay > 0:
        options["countdown"] = delay
    if hint is not None:
        options["headers"] = {ClaimHint.HEADER: hint.header()}
    return options


def make_sender(settings: Settings) -> Sender:
    """Send step messages to the broker that ``settings`` name, by task name.

    A private client app, configured with :func:`celery_settings`: a process
    that runs no Celery app (the CLI, ``harness.start_run``) dispatches for
    the settings it was given. ``tasks`` injects a sender bound to its own app
    instead (``harness.api.use_sender``). The client (and Celery with it) is
    made at the first message: a command that only reads never loads Celery.
    """
    client = _Client(settings)
    publish = functools.partial(client.send_task, STEP_TASK)
    probe = functools.partial(client.send_task, PROBE_TASK)
    return step_sender(publish, settings.broker_url, settings.queue, probe)


class _Client:
    """A Celery client app for ``settings``, made when it first sends."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._app: Celery | None = None

    def send_task(self, name: str, *args: Any, **options: Any) -> Any:
        with self._lock:
            if self._app is None:
                from celery import Celery

                app = Celery("harness-sender", set_as_current=False)
                app.conf.update(celery_settings(self.settings))
                self._app = app
        return self._app.send_task(name, *args, **options)


def step_sender(
    publish: Callable[..., Any],
    broker_url: str,
    queue: str,
    probe: Callable[..., Any] | None = None,
) -> Sender:
    """A :class:`~harness.engine.runtime.Sender` that publishes step messages
    through ``publish(args, kwargs, **options)`` (a task's ``apply_async``, or a
    client's ``send_task`` bound to the step task's name), to ``queue`` on
    ``broker_url``; and the delivery probes, the same messages, through
    ``probe`` (bound to :data:`PROBE_TASK`; None: through ``publish``)."""

    def send(
        run_id: str,
        cursor: int,
        *,
        recovery: bool = False,
        delay: float = 0.0,
        hint: ClaimHint | None = None,
    ) -> None:
        if delay > 0 and not sends_delayed(broker_url, delay):
            return  # the sweeper wakes it at its wake_at
        options = step_options(run_id, cursor, queue, recovery=recovery, delay=delay, hint=hint)
        through = probe if probe is not None and probes.parse(run_id) is not None else publish
        through((run_id,), {"cursor": cursor}, **options)

    return send
