"""One asyncio event loop per thread, for synchronous code that must await.

A step runs in a synchronous Celery task, but a tool or a model may be an
``async def``. ``asyncio.run`` would make, and close, a loop for every call:
a client bound to its loop (``httpx.AsyncClient``, an aiohttp session, an
asyncpg pool) could then never be kept from one call to the next, and each
call would pay for a new loop. Here a thread gets its loop on first use and
keeps it:

* the main thread of a solo worker or of a prefork pool child: one loop per
  process; each thread of a threads pool: one loop per thread;
* a loop is closed when its thread ends, when the worker shuts down
  (:func:`close_all`, from the Celery hooks), or by :func:`close`;
* a forked child never uses a loop its parent made: it makes its own.

Between calls a loop does not run: what a call left scheduled (a task it
started and did not await, a connection pool's keep-alive) waits for the
next call in the same thread. A call stopped by its timeout or from outside
takes the tasks it started with it: they are cancelled before it returns.

:func:`run` is the one entry point: it runs a coroutine to its end on this
thread's loop, and a ``timeout`` cancels it (the coroutine sees
``CancelledError`` and its ``finally`` blocks run) and raises
:class:`TimedOut`. Anything else that stops the call from outside (Celery's
soft time limit, a ``KeyboardInterrupt``) cancels the coroutine the same way
before it goes on up. Called from a thread whose own loop is running (from
inside ``async`` code, which should ``await`` instead), the coroutine runs on
a helper thread's loop and this thread blocks until it ends, as it would for
a synchronous function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds a cancelled coroutine may take to end (its ``finally`` blocks)
#: before its loop is given up on and replaced.
CANCEL_GRACE = 5.0
#: Threads that run the coroutines of callers whose own loop is running.
HELPER_THREADS = 8

#: Started is told the loop and the task of a call as it begins (for :func:`_elsewhere`).
Started = Callable[[asyncio.AbstractEventLoop, "asyncio.Task[Any]"], None]


class TimedOut(TimeoutError):
    """The call's ``timeout`` passed: its coroutine was cancelled, and has ended."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"cancelled after {timeout:g} s")
        self.timeout = timeout


class _ThreadLoop:
    """The loop of one thread; closed when the thread ends and drops it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        #: Given up on (a cancelled coroutine would not end): never run again.
        self.abandoned = False
        with _lock:
            _loops.add(self.loop)

    def __del__(self) -> None:
        if self.abandoned or self.pid != os.getpid():
            return  # given up on, or a parent's freed in a forked child: not to close
        with contextlib.suppress(Exception):  # at interpreter exit, say: never raise here
            _shut(self.loop)


_lock = threading.Lock()
#: Every loop this process made and has not closed (for :func:`close_all`).
_loops: set[asyncio.AbstractEventLoop] = set()
_local = threading.local()
_helpers: concurrent.futures.ThreadPoolExecutor | None = None
#: Loops never to be used, closed or collected (a loop closes itself when
#: collected): a parent's, in a forked child, where closing it would unregister
#: the parent's descriptors from the epoll instance both share; and one left
#: with a cancelled coroutine that would not end.
_inherited: list[Any] = []
#: Called with each loop closed or given up on (:func:`on_close`).
_closers: list[Callable[[asyncio.AbstractEventLoop], None]] = []


def loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, made on first use (a closed one is replaced)."""
    owned: _ThreadLoop | None = getattr(_local, "owned", None)
    if owned is None or owned.loop.is_closed():
        owned = _ThreadLoop()
        _local.owned = owned
    return owned.loop


def run(coro: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """Run ``coro`` to its end on this thread's loop and return its result
    (or raise its exception). Past ``timeout`` seconds it is cancelled and
    :class:`TimedOut` raised once it has ended; a ``timeout`` of 0 or less
    does not start it."""
    if not asyncio.iscoroutine(coro):
        raise TypeError(f"run() takes a coroutine, not {type(coro).__name__}")
    if timeout is not None and timeout <= 0:
        coro.close()
        raise TimedOut(timeout)
    if _running_loop() is not None:
        return _elsewhere(coro, timeout)
    return _here(coro, timeout)


def close() -> None:
    """Close this thread's loop, cancelling what it still holds; the next
    :func:`run` in this thread makes a new one."""
    owned: _ThreadLoop | None = getattr(_local, "owned", None)
    if owned is not None:
        _local.owned = None
        _shut(owned.loop)


def close_all() -> int:
    """Close every loop of this process that is not running a call now (at a
    worker's shutdown). Returns how many were closed."""
    with _lock:
        loops = list(_loops)
    return sum(_shut(each) for each in loops)


def _here(coro: Coroutine[Any, Any, T], timeout: float | None, started: Started | None = None) -> T:
    """``coro`` on this thread's loop; cancelled, and waited for, if the call
    is stopped from outside (an exception raised into the loop itself)."""
    current = loop()
    before = asyncio.all_tasks(current)
    task = current.create_task(_bounded(coro, timeout))
    if started is not None:
        started(current, task)
    try:
        return current.run_until_complete(task)
    except BaseException as err:
        if not task.done():
            _cancel(current, task)
        if isinstance(err, TimedOut) or not isinstance(err, Exception):
            _cancel_left(current, before | {task})
        raise


async def _bounded(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    if timeout is None:
        return await coro
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await coro
    except Exception as err:
        # Cancelled at the timeout, a coroutine may leave by an error of its
        # own (a wrapper that turns CancelledError into one, a finally whose
        # clean-up fails): it was still stopped by the timeout, mid-call.
        if scope.expired():
            raise TimedOut(timeout) from err
        raise


def _cancel_left(current: asyncio.AbstractEventLoop, known: set[asyncio.Task[Any]]) -> None:
    """Cancel the tasks a stopped call started and left (a shielded request,
    a task it never awaited): on a kept loop they would otherwise run during
    some later call of this thread, with no step to answer for them."""
    owned: _ThreadLoop | None = getattr(_local, "owned", None)
    if owned is None or owned.loop is not current:
        return  # the loop was given up on with its call
    left = [t for t in asyncio.all_tasks(current) if t not in known and not t.done()]
    if not left:
        return
    log.warning("cancelling %d task(s) left by a call that was stopped", len(left))
    for each in left:
        each.cancel()
    try:
        current.run_until_complete(asyncio.wait(left, timeout=CANCEL_GRACE))
    except BaseException as err:  # stopped again: the first reason is the one raised
        log.warning("the wait for a stopped call's tasks was stopped too: %r", err)
    for each in left:
        if each.done() and not each.cancelled():
            each.exception()  # retrieved: not the error being raised


def _cancel(current: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """Cancel a call stopped from outside and let it end, for at most
    :data:`CANCEL_GRACE`; a coroutine that will not end takes its loop with it."""
    task.cancel()
    try:
        current.run_until_complete(asyncio.wait([task], timeout=CANCEL_GRACE))
    except BaseException as err:  # stopped again: the first reason is the one raised
        log.warning("a cancelled coroutine's wait was stopped too: %r", err)
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved: it is not the error being raised
        return
    log.warning("a cancelled coroutine did not end in %g s: its loop is replaced", CANCEL_GRACE)
    with _lock:
        _loops.discard(current)
    owned: _ThreadLoop = _local.owned
    owned.abandoned = True
    _inherited.append(owned)  # never collected while this process lives
    _local.owned = None
    _closing(current)


def _elsewhere(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """``coro`` on a helper thread's loop, this thread blocking until it ends;
    stopped from outside, it is cancelled there and waited for."""
    handle: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []
    future = _helper_threads().submit(_here, coro, timeout, lambda lp, t: handle.append((lp, t)))
    try:
        return future.result()
    except BaseException:
        if future.cancel():
            coro.close()  # never started
        elif not future.done() and handle:
            helper_loop, task = handle[0]
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                helper_loop.call_soon_threadsafe(task.cancel)
            concurrent.futures.wait([future], timeout=CANCEL_GRACE)
        raise


def _helper_threads() -> concurrent.futures.ThreadPoolExecutor:
    global _helpers
    with _lock:
        if _helpers is None:
            _helpers = concurrent.futures.ThreadPoolExecutor(
                HELPER_THREADS, thread_name_prefix="harness-aio"
            )
        return _helpers


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _shut(each: asyncio.AbstractEventLoop) -> bool:
    """Cancel what ``each`` still holds, let it end, and close it; False if it
    is running a call now (or was closed already)."""
    if each.is_closed() or each.is_running():
        return False
    try:
        pending = [t for t in asyncio.all_tasks(each) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            each.run_until_complete(asyncio.wait(pending, timeout=CANCEL_GRACE))
        each.run_until_complete(each.shutdown_asyncgens())
    except RuntimeError as err:  # running in another thread after all
        log.warning("an event loop could not be shut down: %s", err)
        return False
    finally:
        with _lock:
            _loops.discard(each)
        _closing(each)
    each.close()
    return True


def on_close(callback: Callable[[asyncio.AbstractEventLoop], None]) -> None:
    """Call ``callback(loop)`` whenever this module closes a loop (or gives
    one up), so that what is kept per loop is dropped with it."""
    _closers.append(callback)


def _closing(each: asyncio.AbstractEventLoop) -> None:
    for callback in list(_closers):
        try:
            callback(each)
        except Exception:  # a closer's failure must not stop the others
            log.exception("a loop's on_close callback failed")


def _after_fork_in_child() -> None:
    """The parent's loops and helper threads are not this process's."""
    global _local, _helpers, _lock
    _lock = threading.Lock()
    _inherited.extend(_loops)
    _inherited.append(_local)
    _loops.clear()
    _local = threading.local()
    _helpers = None


os.register_at_fork(after_in_child=_after_fork_in_child)
