"""The socket ``harness serve`` listens on."""

from __future__ import annotations

import asyncio
import socket

from harness.web.server import _bind


def test_connections_accepted_by_serve_send_without_waiting_for_an_ack() -> None:
    """The listening socket says it is TCP, so asyncio (and uvicorn on it)
    turns Nagle's algorithm off on every connection it accepts: a response's
    body is not held back until the client acknowledges its headers."""
    listener = _bind("127.0.0.1", 0)
    accepted: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            accepted.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            while not accepted:
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(asyncio.wait_for(accept_one(), 10))
    assert accepted == [1]
