"""A worker publishes the agents it carries (harness.catalog).

:class:`Publishing`, a bootstep of the worker (not of its consumer: a
broker reconnection does not withdraw the agents), publishes once as the
worker starts, before it consumes, then refreshes from a thread of the
worker's main process every :data:`harness.catalog.REFRESH` seconds, and
withdraws the worker's rows when it stops cleanly. A store that does not
answer costs a warning, never the worker: the next refresh tries again.

It writes through a store of its own (one connection in use), not the
process's runtime: the runtime is built under a lock that a pool child
forked while this thread held it would inherit held, and its steps' pool
of connections is theirs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from celery import bootsteps

from harness.catalog import REFRESH, Publisher
from harness.clock import SystemClock
from harness.errors import HarnessError
from harness.settings import Settings
from harness.store.migrate import ensure_current
from harness.store.sql import SQLStore

log = logging.getLogger(__name__)

#: Seconds a stopping worker waits for a publish under way before withdrawing.
STOP_WAIT = 5.0


class Refresher:
    """Publishes as ``worker`` now, then every ``interval`` seconds until stopped."""

    def __init__(self, worker: str, settings: Settings, interval: float = REFRESH) -> None:
        self.worker = worker
        self.settings = settings
        self.interval = interval
        self._store: SQLStore | None = None
        self._publisher: Publisher | None = None
        self._stopped = threading.Event()
        #: A publish and the withdrawal never overlap: a publish that committed
        #: after the withdrawal would show a stopped worker live for LIVE seconds.
        self._writing = threading.Lock()
        self._thread = threading.Thread(target=self._refresh, name="harness-catalog", daemon=True)

    def start(self) -> None:
        self._publish()
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing, then withdraw the worker's rows."""
        self._stopped.set()
        with contextlib.suppress(RuntimeError):  # never started
            self._thread.join(STOP_WAIT)
        with self._writing:  # a publish under way finishes first; none starts after
            if self._publisher is None:
                return
            try:
                self._publisher.withdraw()
            except HarnessError as err:  # they age out of the listing instead
                log.warning("agent catalog: could not withdraw worker %s: %s", self.worker, err)
            finally:
                if self._store is not None:
                    self._store.close()

    def _refresh(self) -> None:
        while not self._stopped.wait(self.interval):
            self._publish()

    def _publish(self) -> None:
        with self._writing:
            if not self._stopped.is_set():
                self._publish_now()

    def _publish_now(self) -> None:
        try:
            if self._publisher is None:
                self._store = _open_store(self.settings)
                self._publisher = Publisher(self._store, self.worker, SystemClock())
            self._publisher.publish()
        except HarnessError as err:
            log.warning(
                "agent catalog: could not publish worker %s's agents (retried in %gs): %s",
                self.worker,
                self.interval,
                err,
            )
        except Exception:  # a bug here must not stop the refreshes
            log.exception("agent catalog: publishing worker %s's agents failed", self.worker)


def _open_store(settings: Settings) -> SQLStore:
    """The run store on one connection, migrated if it is the embedded SQLite
    default (as :func:`harness.store.opening.open_store` does for steps)."""
    store = SQLStore.from_url(settings.database_url, pool_size=1)
    try:
        ensure_current(store.engine, auto=store.dialect == "sqlite")
    except HarnessError:
        store.close()
        raise
    return store


class Publishing(bootsteps.StartStopStep):
    """Worker bootstep: the worker's agents in the catalog while it runs.
    Add it with ``app.steps["worker"].add(bootstep(settings))``."""

    label = "harness catalog"
    #: The worker's settings, as its composition root reads them (harness.celery).
    settings: ClassVar[Callable[[], Settings]]

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._refresher: Refresher | None = None

    def start(self, parent: Any) -> None:
        self._refresher = Refresher(str(parent.hostname), type(self).settings())
        self._refresher.start()

    def stop(self, parent: Any) -> None:
        if self._refresher is not None:
            self._refresher.stop()
            self._refresher = None

    terminate = stop


def bootstep(settings: Callable[[], Settings]) -> type[Publishing]:
    """The :class:`Publishing` of a worker whose settings ``settings()`` gives."""
    return type("Publishing", (Publishing,), {"settings": staticmethod(settings)})
