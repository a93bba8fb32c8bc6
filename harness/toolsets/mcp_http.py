"""Streamable HTTP for :mod:`harness.toolsets.mcp`: whether a call's request
reached the server, judged per call.

A request that could not connect was never sent, and a call whose requests
were all refused is not in doubt; the SDK reports it as any closed
connection, so the httpx transport under it notes each request's fate in the
sending call's :class:`Reach`. The SDK sends a request in a copy of its
caller's context, so a ContextVar carries the call's record to it; another
thread's refused request says nothing of this call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass
class Reach:
    """Whether the HTTP requests of one call found the server: ``refused``,
    one could not connect; ``reached``, one did (then the call may have
    been made, whatever else was refused, a reconnection say)."""

    refused: bool = False
    reached: bool = False


#: The call whose HTTP requests are sent in this context (None: the session's
#: own, the handshake). Per call, not per server: another thread's refused
#: request says nothing of whether this call went out.
_REACHING: ContextVar[Reach | None] = ContextVar("harness_mcp_reaching", default=None)


def reach() -> Reach:
    """A call's :class:`Reach`, for the requests sent from this task (the
    SDK sends a request in a copy of its caller's context)."""
    made = Reach()
    _REACHING.set(made)
    return made


@asynccontextmanager
async def transport(url: str, headers: dict[str, str] | None) -> AsyncIterator[Any]:
    """A streamable HTTP transport with ``headers`` on every request, noting
    in each call's :class:`Reach` whether its requests could connect."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(30.0, read=300.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, transport=watched()) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


def watched() -> Any:
    """An httpx transport that notes in the sending call's :class:`Reach`
    whether each request could connect."""
    import httpx2

    class Watched(httpx2.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            call = _REACHING.get()
            try:
                response = await super().handle_async_request(request)
            except httpx2.ConnectError:
                if call is not None:
                    call.refused = True
                raise
            except BaseException:  # connected, then failed: it may have been read
                if call is not None:
                    call.reached = True
                raise
            if call is not None:
                call.reached = True
            return response

    return Watched()
