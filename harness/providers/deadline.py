"""A deadline on a whole provider call, not on each of its reads.

The SDKs' ``timeout`` is httpx's: it bounds each network operation, so a
server that trickles its response a byte at a time never trips it, and the
call can outlast the step's lease (another worker then takes the run over and
buys the same turn again). So each SDK client is given a transport whose every
socket operation (connect, TLS handshake, each write and each read) waits at
most until the deadline of the call under way, which :func:`deadline` sets
around it. Past that, the operation fails as the HTTP library's own timeout
would: the connection is closed, so the provider stops sending, and the SDK
raises its timeout error, which the step records and retries like any other.

The client is the SDK's own (its defaults, the proxies of the environment),
made by its HTTP library (httpx, or pydantic's httpx2 that newer SDKs use);
only the network backend under each of its transports is wrapped. httpx takes
no backend of our choosing, so each pool's is replaced on the client made
here (private attributes: a library without them gets the SDK's plain client
and a warning).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

#: When the call under way in this thread must be over (``time.monotonic()``).
_deadline: ContextVar[float | None] = ContextVar("harness_call_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound every network operation of the calls made in this block to end
    within ``seconds`` of its start, whatever each operation's own timeout (and
    by the deadline of a block around it, if that comes first)."""
    end = time.monotonic() + seconds
    outer = _deadline.get()
    token = _deadline.set(end if outer is None else min(end, outer))
    try:
        yield
    finally:
        _deadline.reset(token)


def http_client(sdk: ModuleType) -> Any | None:
    """The SDK's own HTTP client (``DefaultHttpxClient``: its defaults, and the
    proxies of the environment), each of its transports bounded by
    :func:`deadline`. None when the SDK's HTTP library is not one known here:
    the SDK's default client is then used, each read bounded by the timeout,
    not the whole call."""
    core = _httpcore(sdk)
    if core is None:
        log.warning("%s: unknown HTTP library; a call is bounded per read only", sdk.__name__)
        return None
    client = _closing(sdk.DefaultHttpxClient)()
    transports = [client._transport, *getattr(client, "_mounts", {}).values()]
    pools: list[Any] = [getattr(t, "_pool", None) for t in transports if t is not None]
    if not all(getattr(pool, "_network_backend", None) is not None for pool in pools):
        log.warning("%s: no network backend to bound; a call is bounded per read only", sdk)
        client.close()
        return None
    for pool in pools:
        pool._network_backend = _Backend(pool._network_backend, core)
    return client


@functools.cache
def _closing(client: type) -> type:
    """``client`` closing its connections when it is collected, as the SDK's own
    default client does (a model dropped with its client leaves no socket open)."""

    def __del__(self: Any) -> None:
        with contextlib.suppress(Exception):  # at collection: nowhere to report it
            self.close()

    return type(f"Closing{client.__name__}", (client,), {"__del__": __del__})


def http_library(sdk: ModuleType) -> ModuleType | None:
    """The HTTP library of the SDK's client: ``httpx``, or ``httpx2``; None for another."""
    for cls in getattr(sdk, "DefaultHttpxClient", object).__mro__:
        root = cls.__module__.partition(".")[0]
        if cls.__name__ == "Client" and root in ("httpx", "httpx2"):
            return importlib.import_module(root)
    return None


def _httpcore(sdk: ModuleType) -> ModuleType | None:
    """The httpcore under the SDK's client: ``httpcore`` for ``httpx``,
    ``httpcore2`` for ``httpx2``; None for another library."""
    library = http_library(sdk)
    if library is None:
        return None
    return importlib.import_module("httpcore" if library.__name__ == "httpx" else "httpcore2")


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    """An operation's timeout, cut to what is left before the call's deadline;
    ``expired`` (the library's own timeout error) once nothing is left."""
    end = _deadline.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise expired("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Backend:
    """httpcore's network backend, its streams bounded by the call's deadline."""

    def __init__(self, inner: Any, core: ModuleType) -> None:
        self._inner = inner
        self._core = core

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> _Stream:
        bounded = _left(timeout, self._core.ConnectTimeout)
        stream = self._inner.connect_tcp(host, port, bounded, local_address, socket_options)
        return _Stream(stream, self._core)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> _Stream:
        bounded = _left(timeout, self._core.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, bounded, socket_options), self._core)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Stream:
    """One connection's stream: each read and write waits until the deadline at most."""

    def __init__(self, inner: Any, core: ModuleType) -> None:
        self._inner = inner
        self._core = core

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data: bytes = self._inner.read(max_bytes, _left(timeout, self._core.ReadTimeout))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, self._core.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> _Stream:
        bounded = _left(timeout, self._core.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, bounded), self._core)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)
