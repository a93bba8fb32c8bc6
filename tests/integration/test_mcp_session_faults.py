"""One MCP session per server per process, shared by every thread's calls:
what one caller's failure may and may not do to the others', and what counts
as a call sent. Against our own server (tests.mcp_server) over stdio; calls
are counted from the ledger it writes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import pytest

from harness.errors import ToolUnavailable
from harness.toolsets import ToolsetUnavailable, sessions
from harness.toolsets.mcp import MCPServer
from tests.integration.test_mcp_tools import REPO, alive, call, our_server, tool_of, wait_for
from tests.ledger import Ledger


@pytest.fixture(autouse=True)
def _closed_sessions() -> Iterator[None]:
    yield
    sessions.close_all()


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.txt"


def test_a_listing_the_server_refuses_leaves_a_call_in_flight_alone(ledger: Path) -> None:
    """Thread A's at_most_once call is under way; thread B lists the tools
    for a new run, and the server answers with an error: B's run waits for
    the server, A's call gets its answer on the same session."""
    server = our_server(ledger)
    assert server.list_offered()
    hold = Path(f"{ledger}.hold")
    hold.touch()
    answers: list[object] = []
    failures: list[BaseException] = []

    def send() -> None:
        try:
            answers.append(call(tool_of(server, "held_send"), {"to": "bob"}, "r", 1))
        except BaseException as err:  # reported below
            failures.append(err)

    caller = threading.Thread(target=send)
    caller.start()
    wait_for("the call under way", lambda: ledger.exists() and " r:1 " in ledger.read_text())
    Path(f"{ledger}.unlisted").touch()
    with pytest.raises(ToolsetUnavailable, match="listing its tools failed: MCPError"):
        server.list_offered()
    assert server.connected()
    hold.unlink()
    caller.join(30)
    assert not failures and answers == [{"result": "sent to bob"}]
    assert Ledger.read(ledger).by_key.keys() == {"r:1"}
    Path(f"{ledger}.unlisted").unlink()
    assert server.list_offered()  # the same server answers again


def slow_server(ledger: Path, tmp_path: Path, seconds: float, **options: object) -> MCPServer:
    """tests.mcp_server that takes ``seconds`` to start."""
    slow = tmp_path / "slow.py"
    slow.write_text(
        f"import runpy, sys, time\ntime.sleep({seconds})\nsys.argv = ['mcp_server']\n"
        "runpy.run_module('tests.mcp_server', run_name='__main__')\n"
    )
    env = {"PYTHONPATH": str(REPO), "MCP_LEDGER": str(ledger)}
    return MCPServer("slow", command=sys.executable, args=[str(slow)], env=env, **options)  # type: ignore[arg-type]


def test_starting_the_server_is_not_part_of_a_calls_wait(ledger: Path, tmp_path: Path) -> None:
    """A server slower to start than the call's timeout: the call is made,
    once, when it has started."""
    server = slow_server(ledger, tmp_path, 2.0, timeout=1.0)
    assert call(tool_of(server, "send"), {"to": "bob"}, "s", 1) == {"result": "sent to bob"}
    assert Ledger.read(ledger).by_key.keys() == {"s:1"}


def test_a_server_that_does_not_start_in_time_was_sent_nothing(
    ledger: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up beyond its own limit: unavailable, not sent (an at_most_once
    call is retried, not in doubt)."""
    monkeypatch.setattr(sessions, "STARTUP_TIMEOUT", 0.5)
    server = slow_server(ledger, tmp_path, 3.0)
    with pytest.raises(ToolUnavailable, match="could not be started") as caught:
        call(tool_of(server, "send"), {"to": "bob"}, "s", 1)
    assert caught.value.sent is False and not ledger.exists()


def test_a_call_that_times_out_waiting_for_the_session_was_not_sent(ledger: Path) -> None:
    """The session is held (another thread reopening it) for longer than the
    call's timeout: the call never went out, and says so."""
    server = our_server(ledger, timeout=0.5)
    assert call(tool_of(server, "weather"), {"city": "Oslo"})  # open
    session = server._session()
    held, release = threading.Event(), threading.Event()

    async def hold() -> None:
        assert session._lock is not None
        async with session._lock:
            held.set()
            while not release.is_set():
                await asyncio.sleep(0.01)

    holder = threading.Thread(target=lambda: sessions.run(hold, 30))
    holder.start()
    held.wait(10)
    try:
        with pytest.raises(ToolUnavailable, match="not ready for the call") as caught:
            call(tool_of(server, "send"), {"to": "bob"}, "t", 1)
    finally:
        release.set()
        holder.join(10)
    assert caught.value.sent is False
    assert call(tool_of(server, "note"), {"text": "after"}, "t", 2) == {"result": "noted: after"}
    assert Ledger.read(ledger).by_key.keys() == {"t:2"}  # send never reached the server


def test_closing_a_broken_session_spares_the_listener_of_its_successor(ledger: Path) -> None:
    """Thread X's call broke on the old connection and closes it, while
    thread Y's next call already reopened the server: X's close must not
    stop reading the new server's stderr (it would block on a full pipe)."""
    server = our_server(ledger)
    torn_down = asyncio.Event()

    def slowly_torn_down(errlog: TextIO) -> Any:
        real = server._transport(errlog)

        @asynccontextmanager
        async def transport() -> AsyncIterator[Any]:
            async with real as streams:
                try:
                    yield streams
                finally:
                    await torn_down.wait()  # a teardown that takes a moment

        return transport()

    session = sessions.Session("ledger", slowly_torn_down)

    async def scenario() -> tuple[bool, asyncio.Task[None] | None, asyncio.Task[None] | None]:
        old = await session.client()
        old_listener = session._listener
        assert session._stop is not None and session._lock is not None
        session._stop.set()  # the old connection's output ended (as the pump notes)
        reopen = asyncio.create_task(session.client())  # thread Y's call
        while not session._lock.locked():
            await asyncio.sleep(0.01)
        drop = asyncio.create_task(session.drop(old))  # thread X's call broke on old
        await asyncio.sleep(0)  # X is in close(), waiting for the old teardown
        torn_down.set()
        new = await reopen
        await drop
        assert old_listener is not None and old_listener.done()
        return new is not old, old_listener, session._listener

    try:
        reopened, old_listener, listener = sessions.run(scenario, 30)
        assert reopened and session.connected
        assert listener is not None and listener is not old_listener
        assert not listener.done(), "the new server's stderr is no longer read"
    finally:
        sessions.run(session.close, 10)


def test_whether_a_request_reached_the_server_is_judged_per_call() -> None:
    """Two calls share one HTTP client: one's request is refused (nothing
    sent), the other's reaches a server. Each call's verdict is its own: a
    refusal elsewhere does not make a call that went out look unsent."""
    import httpx2

    from harness.toolsets.mcp_http import reach, watched

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def scenario() -> tuple[object, object]:
        live = await asyncio.start_server(answer, "127.0.0.1", 0)
        dead = await asyncio.start_server(answer, "127.0.0.1", 0)
        ports = [s.getsockname()[1] for s in (*live.sockets, *dead.sockets)]
        dead.close()  # its port now refuses connections
        await dead.wait_closed()
        async with httpx2.AsyncClient(transport=watched()) as http:

            async def request(port: int) -> object:
                made = reach()
                with contextlib.suppress(httpx2.ConnectError):
                    await http.get(f"http://127.0.0.1:{port}/")
                return made

            try:
                return tuple(await asyncio.gather(request(ports[0]), request(ports[1])))
            finally:
                live.close()

    went, refused = sessions.run(scenario, 30)
    assert (went.refused, went.reached) == (False, True)  # type: ignore[attr-defined]
    assert (refused.refused, refused.reached) == (True, False)  # type: ignore[attr-defined]


def test_a_forked_descendant_does_not_keep_a_dead_workers_server_alive(ledger: Path) -> None:
    """A worker process with a stdio server forks (a tool that uses
    multiprocessing's fork, say), and is SIGKILLed: the server sees its
    input end and exits, though the descendant lives on."""
    read, write = os.pipe()
    worker = os.fork()
    if worker == 0:  # the worker: start the server, fork, report both pids, wait
        try:
            server_pid = str(call(tool_of(our_server(ledger), "pid"), {})["result"])  # type: ignore[index]
            descendant = os.fork()
            if descendant == 0:
                signal.pause()  # holds whatever it inherited until killed
                os._exit(0)
            os.write(write, f"{server_pid} {descendant}".encode())
            signal.pause()
        finally:
            os._exit(0)
    os.close(write)
    server_pid, descendant = (int(p) for p in os.read(read, 100).split())  # one write
    os.close(read)
    try:
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)
        wait_for("the server to exit", lambda: not alive(server_pid), 10)
        assert alive(descendant)
    finally:
        for pid in (server_pid, descendant):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
