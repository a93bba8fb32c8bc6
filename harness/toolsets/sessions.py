"""The MCP sessions of this process: one per server, on an event loop of its own.

An MCP client session (the ``mcp`` SDK's ``Client``) lives on the asyncio
loop that opened it, inside the task that entered it. Steps run on Celery's
pool, which calls from the main thread (prefork, solo) or from many threads
(threads pool), never from a loop. So each process keeps one loop, run
forever by a daemon thread, and one session per server on it: a call from
any thread is submitted to that loop (``run_coroutine_threadsafe``) and
waited for. A stdio server is thus one process per worker process, started
on its first use, started again when it died, and stopped when the process
exits (:func:`close_all`, also at interpreter exit).

A forked child (a prefork pool's) inherits the parent's objects but not its
loop thread: it must not touch them. The state is keyed by process id and
dropped after a fork, so the child starts its own loop and servers.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import stat
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from harness.errors import ToolUnavailable

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client import Transport

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a server may take to start and answer the handshake.
STARTUP_TIMEOUT = 30.0
#: Seconds :func:`close_all` waits for the sessions to close.
CLOSE_TIMEOUT = 5.0
#: How much of a stdio server's stderr an error quotes (its own message): at
#: most this many of its last lines, and characters.
STDERR_LINES = 20
STDERR_TAIL = 2000
#: Seconds a failed start waits for the server's last words on stderr.
LAST_WORDS = 1.0


class _Loop:
    """An asyncio loop run forever by a daemon thread of this process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="harness-mcp", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def stop(self) -> None:
        """Stop the loop and wait for its thread (which closes it)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CLOSE_TIMEOUT)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """``coro``'s result, run on the loop. Anything that stops the wait
        (a timeout, Celery's soft time limit) cancels the coroutine too."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g}s") from None
        except BaseException:
            future.cancel()
            raise


class Gate:
    """Whether a call's request went out, decided once between the caller
    that gives up waiting (:meth:`abandon`) and the loop about to send it
    (:meth:`issue`), whichever comes first: so a timeout says truly whether
    the call may have been made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "waiting"

    def issue(self) -> bool:
        """May the request go out? No once the caller has given up."""
        with self._lock:
            if self._state == "abandoned":
                return False
            self._state = "issued"
            return True

    def abandon(self) -> bool:
        """The caller gives up: was the request already going out?"""
        with self._lock:
            if self._state == "issued":
                return True
            self._state = "abandoned"
            return False


class Session:
    """One server's client session, opened on first use and again after it ended.

    ``transport(errlog)`` makes the SDK transport (not entered); ``errlog`` is
    a file the server's stderr goes to, quoted when it fails to start. The
    transport's incoming stream is watched: when it ends (a stdio server
    died, even between calls) the session is closed at once, so the next
    call starts the server again rather than sending into a dead pipe."""

    def __init__(self, name: str, transport: Callable[[TextIO], Transport]) -> None:
        self.name = name
        self._transport = transport
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        #: The server's last lines on stderr (a stdio server's own words).
        self._said: deque[str] = deque(maxlen=STDERR_LINES)
        self._listener: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        """A client is open and its connection has not been seen to end."""
        return self._client is not None and not (self._stop is not None and self._stop.is_set())

    async def client(self) -> Client:
        """The open client; opens one (starts the server) if there is none."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is not None and self._stop is not None and self._stop.is_set():
                await self._closed()  # ended under us: wait for it to be torn down
            if self._client is None:
                await self._open()
            assert self._client is not None
            return self._client

    async def _open(self) -> None:
        errlog = self._listen()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._keeper = asyncio.create_task(self._keep(ready, self._stop, errlog))
        try:
            await asyncio.wait_for(asyncio.shield(ready), STARTUP_TIMEOUT)
        except TimeoutError:
            self._keeper.cancel()
            raise ToolUnavailable(
                await self._failed(f"did not answer within {STARTUP_TIMEOUT:g}s"), sent=False
            ) from None
        except Exception as err:
            raise ToolUnavailable(await self._failed(reason(err)), sent=False) from None
        finally:
            errlog.close()  # the server has its own copy, if it was started

    def _listen(self) -> TextIO:
        """A pipe for the server's stderr: its lines go to this module's log
        (DEBUG) and the last ones are kept, to be quoted if it fails. A pipe,
        not a file: a server that writes a lot for weeks fills nothing."""
        read, write = os.pipe()
        self._said.clear()
        self._listener = asyncio.create_task(self._lines(read))
        return open(write, "w", encoding="utf-8", errors="replace")

    async def _lines(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        source = open(fd, "rb", buffering=0)  # noqa: SIM115 - the pipe transport closes it
        pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), source)
        rest = b""
        try:  # in chunks, never stopping: a server blocked on a full pipe would hang
            while chunk := await reader.read(1 << 16):
                *lines, rest = (rest + chunk).split(b"\n")
                rest = rest[-STDERR_TAIL:]  # a line without end is cut, not kept whole
                for line in lines:
                    self._heard(line)
            self._heard(rest)
        finally:
            pipe.close()

    def _heard(self, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace").rstrip()[-STDERR_TAIL:]
        if text:
            self._said.append(text)
            log.debug("MCP server %r said: %s", self.name, text)

    async def _keep(self, ready: asyncio.Future[None], stop: asyncio.Event, errlog: TextIO) -> None:
        """Hold the client open in this one task (the SDK's task groups must be
        exited by the task that entered them) until asked to stop, or until
        the connection ends under it."""
        from mcp import Client

        watched = _watched(self._transport(errlog), stop.set)
        try:
            async with Client(watched, cache=None) as client:
                self._client = client
                ready.set_result(None)
                await stop.wait()
        except BaseException as err:
            if not ready.done():
                ready.set_exception(err if isinstance(err, Exception) else RuntimeError(err))
            elif not stop.is_set():
                log.warning("MCP server %r: connection ended: %s", self.name, reason(err))
        finally:
            self._client = None

    async def _failed(self, why: str) -> str:
        """The error of a server that did not start, with its own last words
        (read to the end of its output, or for a moment if it lives on)."""
        if self._listener is not None:
            await asyncio.wait({self._listener}, timeout=LAST_WORDS)
        said = "\n".join(self._said).strip()[-STDERR_TAIL:]
        if said:
            return f"MCP server {self.name!r} could not be started ({why}); it said: {said}"
        return f"MCP server {self.name!r} could not be started or reached: {why}"

    async def drop(self, client: Client) -> None:
        """The connection of ``client`` broke: close it, so the next call opens anew."""
        if self._client is client:
            await self.close()

    async def close(self) -> None:
        """Stop the server of now, and its stderr listener: that one, taken
        before waiting, not one a reopen started meanwhile."""
        listener = self._listener
        if self._stop is not None:
            self._stop.set()
        await self._closed()
        if listener is not None:  # a stopped server's output ends soon after
            await asyncio.wait({listener}, timeout=LAST_WORDS)
            listener.cancel()

    async def _closed(self) -> None:
        if self._keeper is not None:
            await asyncio.wait({self._keeper}, timeout=CLOSE_TIMEOUT)


@asynccontextmanager
async def _watched(transport: Transport, ended: Callable[[], None]) -> AsyncIterator[Any]:
    """``transport``'s streams, with ``ended()`` called as soon as the incoming
    one ends (the server closed its output: it exited, or was killed)."""
    import anyio

    async with transport as (incoming, outgoing):
        send, receive = anyio.create_memory_object_stream[Any](0)

        async def pump() -> None:
            try:
                async with send:
                    async for item in incoming:
                        await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            finally:
                ended()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pump)
            try:
                yield receive, outgoing
            finally:
                tasks.cancel_scope.cancel()


def reason(err: BaseException) -> str:
    """What went wrong, out of the SDK's nested exception groups."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    text = str(err) or type(err).__name__
    return text if type(err).__name__ in text else f"{type(err).__name__}: {text}"


_lock = threading.Lock()
_loop: _Loop | None = None
_sessions: dict[object, Session] = {}


def _forget_after_fork() -> None:
    """In a forked child: the parent's loop thread does not exist here, and its
    sessions are the parent's; start afresh (the lock too: it may have been held)."""
    global _loop, _lock
    inherited = _loop
    _lock = threading.Lock()
    _loop = None
    _sessions.clear()
    if inherited is not None:
        _let_go_of_pipes(inherited.loop)


def _let_go_of_pipes(loop: asyncio.AbstractEventLoop) -> None:
    """Drop the child's copies of the parent's pipes to its servers. A child
    (a tool that forks, a pool's) that kept the write end of a stdio server's
    input would keep that server from seeing it end when the parent dies:
    the server would outlive it. Each is pointed at /dev/null rather than
    closed, so the number is not reused while the parent's objects, which
    close it when collected, still name it. Best effort: the pipes are those
    the loop watches (its selector, not public API)."""
    selector = getattr(loop, "_selector", None)
    try:
        fds = list(selector.get_map()) if selector is not None else []
    except (AttributeError, RuntimeError, TypeError):
        return
    pipes = []
    for fd in fds:
        try:
            if isinstance(fd, int) and stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(fd)
        except OSError:
            continue
    if not pipes:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in pipes:
            os.dup2(null, fd)
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_forget_after_fork)


def session(key: object, name: str, transport: Callable[[TextIO], Transport]) -> Session:
    """This process's session for the server ``key`` (made on first use)."""
    with _lock:
        found = _sessions.get(key)
        if found is None:
            found = _sessions[key] = Session(name, transport)
        return found


def _this_loop() -> _Loop:
    global _loop
    with _lock:
        if _loop is None or _loop.pid != os.getpid():
            _loop = _Loop()
        return _loop


def run(call: Callable[[], Awaitable[T]], timeout: float | None) -> T:
    """``call()`` awaited on this process's MCP loop (started on first use)."""

    async def awaited() -> T:
        return await call()

    return _this_loop().run(awaited(), timeout)


async def on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` run on this process's MCP loop, from another loop: for
    clients that belong to one event loop (Pydantic AI's MCP toolsets). A
    cancelled wait cancels it there."""
    future = asyncio.run_coroutine_threadsafe(coro, _this_loop().loop)
    return await asyncio.wrap_future(future)


def close_all() -> None:
    """Close every session of this process: a stdio server sees its input end
    and exits. Called at worker shutdown and at interpreter exit."""
    global _loop
    with _lock:
        loop, sessions = _loop, list(_sessions.values())
        _sessions.clear()
        _loop = None
    if loop is None or loop.pid != os.getpid():
        return

    async def close() -> None:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    try:
        loop.run(close(), CLOSE_TIMEOUT + 1)
    except (TimeoutError, RuntimeError) as err:
        log.warning("MCP sessions not closed cleanly: %s", err)
    loop.stop()


atexit.register(close_all)
