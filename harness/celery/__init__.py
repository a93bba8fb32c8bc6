"""The Celery layer; here, :func:`install`: the harness's tasks in a Celery app, yours or ``tasks``.

Beside it, what Celery processes need from the harness: ``config`` (the
Celery configuration derived from the settings, the queues, and the sender
of processes that run no app), ``sweeper`` (beat's in-process sweep),
``takeover`` (the sweep taken over by a worker while beat does not sweep),
``health`` (worker liveness), ``publishing`` (the agents a worker carries, in
the catalog), ``hooks`` and ``tracing`` (logs, metrics and spans set up in
workers), ``fsbroker`` and ``redisbroker`` (the broker transports), and
``process`` (worker subprocesses, for the demo and the tests). Importing any
of them loads Celery; the library below (``import harness``) does not.

Most teams already run Celery, with their own configuration, broker, routing
and queues. :func:`install` adds the harness to such an app and changes
nothing of the app's own::

    # shop/celery.py
    from celery import Celery
    import harness.celery

    app = Celery("shop")
    app.config_from_object("shop.config")
    harness.celery.install(app, queue="agents")

    celery -A shop worker -Q shop,agents    # agents.recovery is consumed too
    celery -A shop beat                     # the app's entries, and the sweep

What it does to ``app``, and why:

* registers ``tasks.run_step`` and ``tasks.sweep`` (the names of the first
  release: a queued message names its task, so a renamed task would strand
  the messages of a deployment being upgraded), JSON-serialised whatever the
  app's ``task_serializer``, results ignored, ``run_step`` acked late; and
  ``tasks.probe``, the step task under the name of the sweeper's delivery
  probes, so that Flower can tell them from steps;
* routes them to the step queue ``queue`` and its recovery lane
  ``<queue>.recovery``, declared after the app's own ``task_queues`` (Celery's
  default queue is kept if the app declared none); a worker that consumes
  the step queue (``-Q agents``) consumes the lane too, which the sweeper's
  re-sends take;
* adds ``json`` to ``accept_content`` if the app left it out, the harness's
  modules (``HARNESS_IMPORTS``) to ``imports``, the sweep to
  ``beat_schedule`` beside the app's entries and, when the app keeps Celery's
  default beat scheduler, a subclass of it that sweeps in beat's own process
  (:mod:`harness.celery.sweeper`; another scheduler sends the sweep as a
  message on the recovery lane, or mixes in ``InProcessSweep``);
* sends every step message of this process through the app
  (:func:`harness.api.use_sender`);
* in the app's workers and beat, as they start: the run store opened once
  (:func:`refuse_without_a_store`: without a usable one they exit 1 with one
  line), and the store and broker printed above the worker's banner;
* in the app's workers: the liveness heartbeat (:mod:`harness.celery.health`),
  the sweep taken over while beat does not sweep (:mod:`harness.celery.takeover`),
  the agents they carry published to the store (:mod:`harness.celery.publishing`),
  the connection pool sized for a threads pool, structured logs and metrics
  (:mod:`harness.observability`), and traces (:mod:`harness.observability.tracing`, with
  the ``otel`` extra).

Nothing is read at install: the ``HARNESS_*`` settings (the step time limit,
the sweep interval, the default queue) are read when Celery first reads the
app's configuration. Processes that never import the app (``harness start``,
``harness serve``) send to ``HARNESS_QUEUE`` on ``HARNESS_BROKER_URL``: set
them to this app's queue and broker; its workers warn at start when they differ.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task
from celery.signals import beat_init, celeryd_after_setup, worker_init

from harness import compose
from harness.celery import health, hooks, publishing, sweeper, takeover, tracing
from harness.celery.config import (
    PROBE_TASK,
    SCHEDULER,
    STEP_TASK,
    SWEEP_TASK,
    celery_settings,
    declare_queues,
    make_sender,
    recovery_lane,
    step_sender,
)
from harness.engine import runner
from harness.engine.hints import ClaimHint
from harness.engine.runtime import Sender
from harness.errors import HarnessError, StoreError
from harness.settings import Settings
from harness.store import SweepKind

log = logging.getLogger(__name__)

#: Celery's own default scheduler, which :func:`install` replaces by its sweeping subclass.
DEFAULT_SCHEDULERS = ("celery.beat:PersistentScheduler", "celery.beat.PersistentScheduler")
#: The beat entry of the sweep.
SWEEP_ENTRY = "harness-sweep"
#: What the step task must keep whatever the app's configuration says: a step
#: message is acked only after the step (a worker that dies mid-step leaves it
#: to be redelivered), JSON, never rate-limited by the app (StepTask keeps them).
STEP_GUARANTEES: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "serializer": "json",
    "ignore_result": True,
    "rate_limit": None,
    "max_retries": 12,
}


class StepTask(Task):  # type: ignore[type-arg]
    """The step task's class: it keeps :data:`STEP_GUARANTEES` and its time
    limits whatever the app's annotations say (Celery applies an app-wide
    ``'*'`` annotation after the task's own, so no annotation can pin them).
    The soft limit equals the hard one, so that a shorter pool-wide soft
    limit (``task_soft_time_limit``) cannot stop a step early. At the limit
    the soft exception comes just before the kill, and the engine takes it
    for an interruption (``harness.errors.INTERRUPTIONS``): nothing is
    recorded, and the step is resumed like any other interrupted one."""

    @classmethod
    def annotate(cls) -> None:
        super().annotate()
        limit = compose.settings().task_time_limit
        for name, value in {**STEP_GUARANTEES, "time_limit": limit}.items():
            setattr(cls, name, value)
        cls.soft_time_limit = limit  # type: ignore[assignment]  # Celery takes seconds as floats


def _run_step(task: Task[Any, Any], run_id: str, cursor: int | None = None) -> str:
    """Carry ``run_id`` forward by one step (see harness.engine.runner)."""
    hint = ClaimHint.from_header(task.request.get(ClaimHint.HEADER))
    return runner.run_step(compose.runtime(), run_id, cursor, hint).value


def _sweep() -> int:
    """One sweep on demand; beat sweeps in its own process (harness.celery.sweeper)."""
    return sweeper.sweep(compose.runtime(), SweepKind.TASK)


@dataclass(frozen=True)
class Installed:
    """The harness's tasks on one app, and the sender bound to that app."""

    app: Celery
    run_step: Task[Any, Any]
    sweep: Task[Any, Any]
    #: The step queue; None: ``HARNESS_QUEUE``, read with the settings.
    queue: str | None
    #: True for the ``tasks`` app, whose broker *is* ``HARNESS_BROKER_URL``.
    broker_from_settings: bool
    #: The step task under the probes' name (``tasks.probe``): Flower tells them apart.
    probe: Task[Any, Any] | None = None

    def step_queue(self, settings: Settings) -> str:
        """The step queue of this app for ``settings``."""
        return self.queue or settings.queue

    def sender(self, settings: Settings) -> Sender:
        """Send step messages through this app and its producer pool.

        For the ``tasks`` app, only while it is configured for the broker
        ``settings`` name (in a worker or beat, always); otherwise, as when
        the environment changed after the app read it, through a client of
        their own. An app of your own has its own broker: always through it.
        """
        if self.broker_from_settings:
            wanted = celery_settings(settings)
            conf = self.app.conf
            if any(conf.get(k) != v for k, v in wanted.items() if k.startswith("broker")):
                return make_sender(settings)
        broker = str(self.app.conf.broker_url or "amqp://")  # Celery's default is AMQP
        probe = None if self.probe is None else self.probe.apply_async
        return step_sender(self.run_step.apply_async, broker, self.step_queue(settings), probe)


def install(
    app: Celery, *, queue: str | None = None, broker_from_settings: bool = False
) -> Installed:
    """Register the harness's tasks on ``app``, route them to ``queue`` (and
    ``<queue>.recovery``), and hook its workers and beat; see the module
    docstring. ``queue`` None: ``HARNESS_QUEUE`` (default ``harness``).
    ``broker_from_settings``: the app is configured from the ``HARNESS_*``
    variables (the ``tasks`` app). Call it once per app, where the app is
    created; the last app installed in a process sends its step messages."""

    def register(name: str) -> Callable[[Callable[..., str]], Task[Any, Any]]:
        return app.task(
            name=name,
            base=StepTask,
            bind=True,  # the message's headers: a ClaimHint
            shared=False,
            # The store was unreachable (a database restart, a dropped connection): try
            # again with backoff. If retries run out, the sweeper resumes the run later.
            autoretry_for=(StoreError,),
            retry_backoff=1,
            retry_backoff_max=30,
            **STEP_GUARANTEES,
        )

    run_step = register(STEP_TASK)(_run_step)
    # The delivery probes: the step task under a name of its own, so that Flower
    # can tell them apart; taken off the same queues, with the same guarantees.
    probe = register(PROBE_TASK)(_run_step)
    # Acked on receipt: a sweep lost with its worker is harmless, the next one comes.
    sweep = app.task(
        name=SWEEP_TASK, shared=False, serializer="json", ignore_result=True, acks_late=False
    )(_sweep)
    installed = Installed(app, run_step, sweep, queue, broker_from_settings, probe)

    def configured(sender: Any = None, source: Any = None, **_: Any) -> None:
        merge_configuration(app, source, queue)

    if getattr(app, "configured", False):  # read already: merge now
        merge_configuration(app, app.conf, queue)
    else:
        app.on_after_configure.connect(configured, weak=False)
    compose.use_sender(installed.sender)
    sweeper.use(compose.runtime, compose.settings)
    _hook_workers(installed)
    return installed


def merge_configuration(app: Celery, conf: Any, queue: str | None) -> None:
    """Add the harness's queues, routes, limits and sweep to ``conf`` (the
    app's configuration, just read), keeping every setting of the app's own.

    Routers are asked in order and the first answer wins: the harness's come
    first, and answer for its two tasks only. Annotations all apply in order:
    the harness's come last, so an app-wide ``'*'`` annotation cannot lift
    the step's time limit above the broker's visibility timeout."""
    settings = compose.settings()
    step_queue = queue or settings.queue
    lane = recovery_lane(step_queue)
    mine = conf.task_queues or list(app.amqp.Queues([]).values())  # Celery's default
    names = {q.name for q in mine}
    broker = str(conf.broker_url or "amqp://")
    ours = [q for q in declare_queues(step_queue, broker) if q.name not in names]
    conf.task_queues = [*mine, *ours]
    built = app.amqp.__dict__.get("queues")  # a cached property: already built from the old list
    if built is not None:
        for declared in ours:
            built.add(declared)
    conf.task_routes = (
        {STEP_TASK: {"queue": step_queue}, SWEEP_TASK: {"queue": lane}},
        *_as_list(conf.task_routes),
    )
    conf.task_annotations = (
        *_as_list(conf.task_annotations),
        {
            # StepTask keeps it, and its guarantees, whatever other annotations say.
            STEP_TASK: {"time_limit": settings.task_time_limit},
            # Dropped unrun once the next sweep is due: sweeps never pile up.
            SWEEP_TASK: {"expires": settings.sweep_interval},
        },
    )
    accepted = list(conf.accept_content or [])
    if not {"json", "application/json"} & set(accepted):
        conf.accept_content = [*accepted, "json"]
    conf.imports = tuple(dict.fromkeys([*_as_list(conf.imports), *settings.imports]))
    schedule = dict(conf.beat_schedule or {})
    schedule[SWEEP_ENTRY] = {"task": SWEEP_TASK, "schedule": settings.sweep_interval}
    conf.beat_schedule = schedule
    scheduler = conf.beat_scheduler
    if isinstance(scheduler, str) and scheduler in DEFAULT_SCHEDULERS:
        conf.beat_scheduler = SCHEDULER


def _as_list(value: Any) -> list[Any]:
    """A Celery setting that takes one item or a sequence of them, as a list."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _hook_workers(installed: Installed) -> None:
    """Connect the worker-side hooks, for this app's workers only."""
    app = installed.app
    # Liveness for a supervisor: a heartbeat file that only a consuming worker keeps
    # fresh, read by `harness health --worker` (harness.celery.health).
    app.steps["consumer"].add(health.bootstep(compose.settings))
    # Recovery without beat: a worker takes the sweep over while beat does not sweep.
    app.steps["worker"].add(takeover.bootstep(installed.sender, compose.settings))
    # The agents this worker carries, in the store's catalog while it runs.
    app.steps["worker"].add(publishing.bootstep(compose.settings))

    def starting(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            refuse_without_a_store("worker")
            _size_the_connection_pool(sender)
            _check_the_step_task(app)
            _warn_about_other_senders(installed, compose.settings())

    def queues_chosen(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is app:
            settings = compose.settings()
            consume_the_recovery_lane(app, installed.step_queue(settings))
            if not getattr(instance, "quiet", False):
                _say_where(installed, settings)

    def beat_starting(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            refuse_without_a_store("beat")  # beat sweeps: it needs the store as much

    worker_init.connect(starting, weak=False)
    beat_init.connect(beat_starting, weak=False)
    celeryd_after_setup.connect(queues_chosen, weak=False)
    hooks.install_celery_hooks(compose.settings)
    # Spans per step; does nothing unless the settings ask for it (the otel extra).
    tracing.instrument(app, compose.settings)


def refuse_without_a_store(process: str) -> None:
    """Stop a worker or beat that starts without a usable run store, with one
    line on stderr and exit status 1, before it consumes anything.

    Run in the main process as it starts (``worker_init``, ``beat_init``):
    the store is opened as a step would open it (connect; the SQLite default
    made and migrated, PostgreSQL's revision checked) and closed again, so a
    wrong ``HARNESS_DATABASE_URL`` or an unmigrated database is said at once,
    not found by the first step, retried and logged below the default level.
    Celery's signals catch ``Exception`` from their handlers; ``SystemExit``
    goes through them."""
    try:
        compose.open_store(compose.settings()).close()
    except HarnessError as err:
        raise SystemExit(f"harness: this {process} cannot start: {err}") from None


def _say_where(installed: Installed, settings: Settings) -> None:
    """Above Celery's banner, the run store (and the broker, for the ``tasks``
    app) this worker uses: a ``harness`` command run with other settings (the
    embedded default is relative to the working folder) names its own, and
    the two can be compared."""
    where = settings.where if installed.broker_from_settings else f"store {settings.store_shown}"
    sys.stdout.write(f"harness: {where}\n")
    sys.stdout.flush()


def _size_the_connection_pool(worker: Any) -> None:
    """Under the threads pool every step of this worker shares one process and
    its store: size the connection pool for them all (lease renewals have a
    pool of their own). ``HARNESS_DB_POOL_SIZE`` overrides it."""
    pool = getattr(worker, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    if "thread" in str(name):
        compose.use_step_threads(int(worker.concurrency))


def consume_the_recovery_lane(app: Celery, queue: str) -> None:
    """A worker that consumes the step queue consumes its recovery lane too,
    just before it (``-Q agents`` alone would leave every re-send unread)."""
    queues = app.amqp.queues
    names = list(queues.consume_from)
    lane = recovery_lane(queue)
    if queue in names and lane not in names:
        names.insert(names.index(queue), lane)
        queues.select(names)


def _check_the_step_task(app: Celery) -> None:
    """Say so, loudly, if the app's configuration loosened the step task's
    guarantees after all (annotations applied before the harness's merge)."""
    task = app.tasks[STEP_TASK]
    loosened = {
        name: getattr(task, name, None)
        for name, wanted in STEP_GUARANTEES.items()
        if getattr(task, name, None) != wanted
    }
    if loosened:
        log.error(
            "harness: the app's configuration changed %s on %s; steps may be lost or "
            "interrupted mid-call: remove those settings for this task",
            ", ".join(f"{k}={v!r}" for k, v in sorted(loosened.items())),
            STEP_TASK,
        )


def _warn_about_other_senders(installed: Installed, settings: Settings) -> None:
    """Processes that do not import this app send where the settings say."""
    if installed.broker_from_settings:
        return
    queue = installed.step_queue(settings)
    if queue != settings.queue:
        log.error(
            "harness: this app's step queue is %r but HARNESS_QUEUE is %r: `harness start` "
            "and `harness serve` send to %r, where no worker of this app listens; "
            "set HARNESS_QUEUE=%s for them",
            queue,
            settings.queue,
            settings.queue,
            queue,
        )
    if str(installed.app.conf.broker_url or "") != settings.broker_url:
        log.warning(
            "harness: HARNESS_BROKER_URL differs from this app's broker_url: processes "
            "that do not import this app (`harness start`, `harness serve`) send elsewhere"
        )
