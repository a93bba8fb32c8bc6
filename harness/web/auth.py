"""Who may talk to the API: one shared bearer token, as notebook servers do.

Scripts send ``Authorization: Bearer <token>``. A browser cannot add that
header to a page load, so ``GET /login?token=...`` trades the token for a
cookie (HttpOnly, so page scripts never see it; SameSite=Strict, so another
site's page does not send it). A cookie is sent by the browser whoever asked
for the request, so a state-changing request authenticated by the cookie
alone must also carry ``X-Harness-Request: 1``: a custom header that a
cross-site form cannot add and a cross-site script cannot send without a CORS
preflight, which this app never grants. Only ``/healthz``, the login form,
the icon and the callback URLs of deferred calls (``/api/callbacks/{token}``,
whose signed token is their authority: harness.callbacks) answer without a
token.

A request without the token is told so, one with another token is told that
it is not the right one: both 401, so a person can tell a missing header
from a stale one. The check runs in the app's door (harness.web.door),
before any of the body is read.
"""

from __future__ import annotations

import hmac
import html
from typing import NamedTuple

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

#: The dashboard's session cookie: the token itself.
COOKIE = "harness_token"
#: The header that a cookie-authenticated POST must carry (the CSRF guard).
CSRF_HEADER = "x-harness-request"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

bearer = HTTPBearer(auto_error=False, description="The token of HARNESS_API_TOKEN")


#: What a request without any token is told.
MISSING = "a token is needed: Authorization: Bearer <HARNESS_API_TOKEN>"
#: What a request whose bearer token is not the one is told.
WRONG = "that token is not the right one: Authorization: Bearer <HARNESS_API_TOKEN>"
#: What a browser whose login cookie holds another token is told.
STALE = "the session's token is not the right one: log in again at /login"


class Refusal(NamedTuple):
    """Why a request is not let in: its HTTP status and a message for a person."""

    status: int
    detail: str


class Guard:
    """Checks requests against the one token, in constant time."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the API token must not be empty")
        self._token = token.encode()

    def matches(self, candidate: str | None) -> bool:
        """Whether ``candidate`` is the token (compared in constant time)."""
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._token)

    def refusal(
        self, method: str, bearer_token: str | None, cookie: str | None, csrf: str | None
    ) -> Refusal | None:
        """None if the request may come in: the bearer token, or the login
        cookie (with the CSRF header on a write). Otherwise 401, saying
        whether a token was missing or wrong, or 403 for a cookie-carried
        write without the CSRF header."""
        if self.matches(bearer_token):
            return None
        if self.matches(cookie):
            if method not in _SAFE_METHODS and csrf != "1":
                return Refusal(403, f"a write from the dashboard needs {CSRF_HEADER}: 1")
            return None
        if bearer_token is not None:
            return Refusal(401, WRONG)
        return Refusal(401, STALE if cookie is not None else MISSING)

    def check(self, request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
        """Raise :meth:`refusal` as an ``HTTPException``, if there is one."""
        refused = self.refusal(
            request.method,
            None if credentials is None else credentials.credentials,
            request.cookies.get(COOKIE),
            request.headers.get(CSRF_HEADER),
        )
        if refused is not None:
            raise HTTPException(refused.status, refused.detail, headers=challenge(refused))


def challenge(refused: Refusal) -> dict[str, str] | None:
    """The headers of a refusal: a 401 names the scheme it wants."""
    return {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None
    (no header, or another scheme), as :data:`bearer` reads it."""
    scheme, _, token = (authorization or "").partition(" ")
    return token or None if scheme.lower() == "bearer" else None


def dependency(guard: Guard):  # type: ignore[no-untyped-def]  # FastAPI reads the signature
    """The FastAPI dependency that applies ``guard`` to a route. The door
    (harness.web.door) has let only such requests in already; this declares
    the scheme in ``/openapi.json`` and guards a route mounted without it."""

    def authorized(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Security(bearer),  # noqa: B008
    ) -> None:
        guard.check(request, credentials)

    return authorized


def login_page(message: str = "") -> str:
    """The form that asks for the token (the page of a 401 in a browser)."""
    note = f'<p class="error">{html.escape(message)}</p>' if message else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>harness: log in</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<style>
body {{ font: 15px system-ui, sans-serif; background: #f4f5f7; color: #1d2330; }}
.login {{ max-width: 22rem; margin: 12vh auto; background: #fff; padding: 2rem;
  border-radius: 8px; box-shadow: 0 1px 4px #0002; }}
input {{ display: block; width: 100%; margin: .4rem 0 1rem; padding: .5rem;
  box-sizing: border-box; }}
.error {{ color: #b3261e; }} .hint {{ color: #5b6475; font-size: 13px; }}
</style></head>
<body><main class="login">
<h1>harness</h1>{note}
<form method="post" action="/login">
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<button type="submit">Log in</button>
</form>
<p class="hint">The token is HARNESS_API_TOKEN, or the one <code>harness serve</code>
printed in its login URL.</p>
</main></body></html>
"""
