"""The composition root of a process that uses the library.

The settings are read from the environment here, once per process, and the
runtime (store, cache, clock, sender, limits) is built from them here, on
first use, and handed down: nothing below reaches back up for the settings,
the store or the app. The roots that call into it are the public API
(harness.api), the CLI's entry, the web app's server and a Celery worker's
start (harness.celery), which also injects its app's sender
(:func:`use_sender`) and its threads pool's size (:func:`use_step_threads`).

A Celery prefork child must not share a database connection with its
parent: a runtime inherited across a fork is dropped, unclosed, and built
again in the child. Building it imports no agent code: the
``HARNESS_IMPORTS`` modules are imported by :func:`ensure_agents`, only
where an agent is needed (starting a run, resolving a step as failed; a
Celery worker imports them itself), so reading runs works even where the
agents cannot be imported.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness import faults
from harness.agents import import_modules
from harness.clock import SystemClock
from harness.engine.executor import Cache, NoCache, RedisCache
from harness.engine.runtime import Runtime, Sender
from harness.providers.prices import Prices
from harness.providers.ratelimit import RateLimiter
from harness.reads import Reads
from harness.settings import Settings
from harness.store import Store
from harness.streams import RedisSink, Sink, StoreSink

if TYPE_CHECKING:
    from harness.store.sql import SQLStore

#: The most connections kept for step threads when their number is derived from
#: the concurrency: a step holds a connection only for each statement (about a
#: millisecond of a step that mostly waits on its model), so 16 serve hundreds
#: of threads (bench.waiting), and PostgreSQL's connections stay bounded.
STEP_CONNECTIONS = 16

#: Reentrant: building the runtime builds the app's sender, which may read the
#: app's configuration for the first time, which asks for the settings.
_lock = threading.RLock()
_settings: Settings | None = None
_runtime: Runtime | None = None
_pid = 0
_agents_imported: tuple[str, ...] | None = None
#: Threads of this process that run steps at once (the worker's concurrency
#: under the threads pool, set by the Celery layer); sizes the connection pool.
_step_threads: int | None = None


def client_sender(settings: Settings) -> Sender:
    """The default sender: a private Celery client app for ``settings``
    (:func:`harness.celery.config.make_sender`). The Celery layer is imported
    with the first message, not when the runtime is built: a process that only
    reads (``harness show``) never loads it, and this module, which that layer
    imports, does not import it back."""
    lock = threading.Lock()
    made: list[Sender] = []

    def send(run_id: str, cursor: int, **options: Any) -> None:
        with lock:
            if not made:
                from harness.celery.config import make_sender

                made.append(make_sender(settings))
        made[0](run_id, cursor, **options)

    return send


#: Builds the runtime's sender from its settings: by default a private client
#: app (:func:`client_sender`); the ``tasks`` app injects one bound to itself.
_sender_factory: Callable[[Settings], Sender] = client_sender
#: Opens the runtime's store from its settings; None: :func:`open_store`.
_store_factory: Callable[[Settings], Store] | None = None


def settings() -> Settings:
    """This process's settings, read from the environment once (again after :func:`reset`)."""
    global _settings
    with _lock:
        if _settings is None:
            _settings = Settings.from_env()
        return _settings


def use_step_threads(count: int) -> None:
    """Size the connection pool of runtimes built from now on for ``count``
    threads running steps at once (``HARNESS_DB_POOL_SIZE`` overrides it).
    The Celery layer calls it with a threads pool's concurrency."""
    global _step_threads
    with _lock:
        _step_threads = count


def use_sender(factory: Callable[[Settings], Sender]) -> None:
    """Send step messages through ``factory(settings)`` in runtimes built from now on.

    The Celery layer calls it (``tasks`` binds the sender to its own app), so
    the library never imports the Celery app.
    """
    global _sender_factory
    with _lock:
        _sender_factory = factory


def use_store(factory: Callable[[Settings], Store] | None) -> None:
    """Open the store of runtimes built from now on with ``factory(settings)``;
    None: the configured one again (:func:`open_store`).

    Tests run the public API on an in-memory store this way
    (``use_store(lambda settings: MemoryStore())``, harness.store.memory).
    Deliberately not a setting: nothing in the environment selects it.
    """
    global _store_factory
    with _lock:
        _store_factory = factory


def open_store(config: Settings) -> SQLStore:
    """The configured store for this process's steps, its pool sized for its
    step threads; migrated if it is the embedded SQLite default. The SQL
    backend (SQLAlchemy) loads here, where a store is first opened, not with
    ``import harness``."""
    from harness.store import opening

    threads = _step_threads
    return opening.open_store(config, threads and min(threads, STEP_CONNECTIONS))


def build_runtime(config: Settings, store: Store, sender: Sender) -> Runtime:
    """The runtime for ``config`` on ``store``, sending through ``sender``."""
    cache: Cache = NoCache()
    if config.redis_url:
        # A hung Redis must not delay a lease renewal past the TTL.
        cache = RedisCache.from_url(config.redis_url, min(1.0, config.lease_ttl / 6))
    return Runtime(
        store,
        cache,
        SystemClock(),
        f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
        config.lease_ttl,
        sender,
        step_time_limit=config.step_time_limit,
        chain_budget=config.chain_budget,
        crash=faults.armed(config.crash_at),
        heartbeat_store=store.heartbeat_store(),
        limiter=RateLimiter.from_settings(config.redis_url, config.rate_limits, config.rate_window),
        prices=Prices.parse(config.prices),
        probes=config.delivery_probes,
        callback_secret=config.callback_secret,
        public_url=config.public_url,
        streams=stream_sink(config, store),
    )


def stream_sink(config: Settings, store: Store) -> Sink:
    """Where this process publishes answers as they are written: the Redis
    of HARNESS_REDIS_URL, else the run store (harness.streams)."""
    if config.redis_url:
        # A hung Redis must not hold a model call up for long (the tap goes quiet).
        return RedisSink.from_url(
            config.redis_url, config.stream_ttl, min(1.0, config.lease_ttl / 6)
        )
    return StoreSink(store, config.stream_ttl)


def runtime() -> Runtime:
    """This process's runtime, built from its settings on first use."""
    global _runtime, _pid
    config = settings()
    with _lock:
        if _runtime is not None and _pid != os.getpid():
            # Forked: the inherited connections are the parent's; forget them unclosed.
            _runtime.store.forget_connections()
            _runtime = None
        if _runtime is None:
            store = (_store_factory or open_store)(config)
            _runtime = build_runtime(config, store, _sender_factory(config))
            _pid = os.getpid()
        return _runtime


def reset() -> None:
    """Forget this process's runtime and settings (tests; after the environment changed)."""
    global _runtime, _settings
    with _lock:
        if _runtime is not None:
            _runtime.store.close()
        _runtime = None
        _settings = None


def ensure_agents() -> None:
    """Import the ``HARNESS_IMPORTS`` modules, which register agents and tools.

    Once per process and set of modules (imports persist across a fork);
    resolved from the working directory first, as Celery does. Raises
    :class:`ConfigError` naming a module that cannot be imported.
    """
    global _agents_imported
    imports = settings().imports
    if imports != _agents_imported:
        import_modules(imports)
        _agents_imported = imports


def reads() -> Reads:
    """The read service (listing, a run's steps and history, stats) on this
    process's store. Imports no agent code."""
    rt = runtime()
    config = settings()
    return Reads(rt.store, rt.clock, config.running_alert, config.sweep_interval)
