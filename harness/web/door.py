"""The app's door: a request is let in, or answered, before its body is read.

FastAPI reads and parses a route's body before it runs the route's
dependencies, so a token checked there is checked only after a stranger's
body has been read into memory (a 1 GB POST was held whole before its 401).
The door is a pure ASGI middleware in front of the whole app that decides
from the request line and headers alone, then lets the body through only up
to a limit, counted as it streams:

* a request without the token (harness.web.auth) is answered 401 (403: a
  write carried by the login cookie without the CSRF header), and none of
  its body is read; ``/healthz``, the login form and the icon are open, and
  so are callback URLs (``/api/callbacks/{token}``), whose signed token is
  verified here (401 forged, 404 expired, 503 no secret) before their body
  is read, and again by the route with the answer;
* a ``Content-Length`` above the limit is answered 413 at once;
* a body that streams past the limit (chunked, or longer than it said) is
  cut off there: the app's read raises :class:`BodyTooLarge`, a 413.

The limit is ``HARNESS_API_MAX_BODY`` (1 MiB by default); the login form's
is :data:`LOGIN_MAX_BODY`, a token being short. Whatever a refused client
still sends, the server (uvicorn) reads and drops without keeping it.
"""

from __future__ import annotations

import time

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import cookie_parser
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness import callbacks
from harness.errors import ConfigError
from harness.web import auth

#: The paths that answer without the token.
OPEN_PATHS = frozenset({"/healthz", "/login", "/favicon.ico"})
#: The paths under which a signed token in the path is the authority (a
#: deferred call's callback URL, harness.callbacks): no bearer token, the
#: body limit as for every other request.
SIGNED_PREFIX = "/api/callbacks/"
#: The largest body ``POST /login`` reads, bytes: a form with one token in it.
LOGIN_MAX_BODY = 4096


class BodyTooLarge(HTTPException):
    """A request body streamed past its limit: raised from the app's read of
    it (FastAPI passes an ``HTTPException`` from a body read on), answered 413."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class Door:
    """The ASGI middleware of the module docstring."""

    def __init__(
        self, app: ASGIApp, guard: auth.Guard, max_body: int, callback_secret: str | None = None
    ) -> None:
        self.app = app
        self.guard = guard
        self.max_body = max_body
        self.callback_secret = callback_secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope["path"]
        if _open(path):
            refused = self._unsigned(path) if path.startswith(SIGNED_PREFIX) else None
        else:
            refused = self._refusal(scope, headers)
        if refused is None:
            limit, detail = self._limit(path)
            if _declared(headers) > limit:
                refused = _problem(413, detail)
            else:
                await self.app(scope, _metered(receive, limit, detail), send)
                return
        await refused(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> Response | None:
        cookies = cookie_parser(headers.get("cookie", ""))
        refused = self.guard.refusal(
            scope["method"],
            auth.bearer_token(headers.get("authorization")),
            cookies.get(auth.COOKIE),
            headers.get(auth.CSRF_HEADER),
        )
        if refused is None:
            return None
        path: str = scope["path"]
        if refused.status == 401 and _wants_html(path, headers):
            note = "" if refused.detail == auth.MISSING else refused.detail
            return HTMLResponse(auth.login_page(note), 401, headers=auth.challenge(refused))
        return _problem(refused.status, refused.detail, auth.challenge(refused))

    def _unsigned(self, path: str) -> Response | None:
        """A callback URL whose token this harness did not sign, or that has
        expired: refused before its body is read (a stranger's body is not
        parsed). The route checks the token again, with the run's answer."""
        try:
            callbacks.verify(self.callback_secret, path[len(SIGNED_PREFIX) :], time.time())
        except callbacks.BadToken as err:
            return _problem(401, str(err))
        except callbacks.ExpiredToken as err:
            return _problem(404, str(err))
        except ConfigError as err:
            return _problem(503, str(err))
        return None

    def _limit(self, path: str) -> tuple[int, str]:
        if path == "/login":
            return LOGIN_MAX_BODY, f"a login form is at most {LOGIN_MAX_BODY:,} bytes"
        return (
            self.max_body,
            f"the request body is larger than HARNESS_API_MAX_BODY ({self.max_body:,} bytes)",
        )


def _open(path: str) -> bool:
    """A path answered without the token: one of :data:`OPEN_PATHS`, or a
    callback URL (one segment under :data:`SIGNED_PREFIX`, nothing below it)."""
    if path in OPEN_PATHS:
        return True
    return path.startswith(SIGNED_PREFIX) and "/" not in path[len(SIGNED_PREFIX) :]


def _declared(headers: Headers) -> int:
    """The body's declared length (0 if none, or not a number: h11 refuses those)."""
    raw = headers.get("content-length", "")
    if not raw.isdigit():
        return 0
    return int(raw) if len(raw) < 19 else 1 << 63  # no need to parse a thousand digits


def _metered(receive: Receive, limit: int, detail: str) -> Receive:
    """``receive``, raising :class:`BodyTooLarge` once more than ``limit``
    bytes of body have come: the excess is never handed on."""
    seen = 0

    async def metered() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(detail)
        return message

    return metered


def _wants_html(path: str, headers: Headers) -> bool:
    """A browser loading a page (not a script calling the API): show it the login form."""
    return not path.startswith("/api/") and "text/html" in headers.get("accept", "")


def _problem(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)
