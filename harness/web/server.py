"""``harness serve``: the API and dashboard on uvicorn.

The token is ``HARNESS_API_TOKEN``; without one, a random token is made for
this process and printed in a login URL, as notebook servers do, so the API
is never open by accident. The socket is bound before anything is printed,
so the URL names the real port (``--port 0`` picks a free one). The app runs
in one process: it only reads the store and sends messages; a second
instance behind the same proxy is how it scales.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote_plus

import uvicorn

from harness import compose
from harness.errors import ConfigError
from harness.observability import logs
from harness.settings import Settings
from harness.web.app import create_app


@dataclass(frozen=True)
class Serving:
    """Where the server listens, and how a person logs in to it."""

    host: str
    port: int
    token: str
    generated: bool

    @property
    def base_url(self) -> str:
        # 0.0.0.0 and :: listen everywhere; a browser on this machine reaches loopback.
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def login_url(self) -> str:
        """The URL that logs a browser in (it carries the token: keep it private)."""
        return f"{self.base_url}/login?token={self.token}"

    def announcement(self) -> list[str]:
        """What ``harness serve`` prints once it listens."""
        if self.generated:
            return [
                "HARNESS_API_TOKEN is not set: this process made a token of its own.",
                f"log in at {self.login_url}",
            ]
        return [f"dashboard at {self.base_url}/ (log in with HARNESS_API_TOKEN)"]


class RedactTokens(logging.Filter):
    """Blanks the token of a login URL in uvicorn's access log lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redacted(a) if isinstance(a, str) and "?" in a else a for a in record.args
            )
        return True


def redacted(target: str) -> str:
    """``target`` (a path and query, as the access log writes it) with the
    value of each query parameter named ``token`` replaced by ``<redacted>``.

    Names are compared percent-decoded, as the app reads them (``%74oken`` is
    ``token`` to FastAPI), and regardless of case, so no spelling that logs
    in is written out."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    pairs = query.split("&")
    for i, pair in enumerate(pairs):
        name = pair.partition("=")[0]
        if unquote_plus(name).casefold() == "token":
            pairs[i] = f"{name}=<redacted>"
    return f"{path}?{'&'.join(pairs)}"


#: Seconds a stop waits for the requests under way (event streams included).
SHUTDOWN_GRACE = 3


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that
    # say they are TCP, and without it every response's body waited for the
    # client's delayed ACK of its headers (40 ms on Linux, on a kept-alive
    # connection).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.listen(2048)
    return sock


def serve(
    settings: Settings, host: str, port: int, announce: Callable[[str], None] = print
) -> None:
    """Listen on ``host:port`` and serve until interrupted. ``FORWARDED_ALLOW_IPS``
    (uvicorn's own variable) names the proxies whose X-Forwarded-* headers are
    believed."""
    token, generated = settings.api_token, False
    if not token:
        token, generated = secrets.token_urlsafe(24), True
    logs.configure(settings)  # uvicorn's loggers too: its own set-up is switched off
    logging.getLogger("uvicorn.access").addFilter(RedactTokens())
    app = create_app(token, compose.reads(), settings)  # reaches the store before we listen
    sock = _bind(host, port)
    serving = Serving(host, sock.getsockname()[1], token, generated)
    for line in serving.announcement():
        announce(line)
    # A follower's event stream (GET /api/runs/{id}/events) lasts as long as its
    # run moves: a stop waits for it this long, then ends it (the client resumes
    # with Last-Event-ID wherever it reconnects), instead of waiting for ever.
    config = uvicorn.Config(
        app,
        log_config=None,
        proxy_headers=True,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
    uvicorn.Server(config).run(sockets=[sock])
