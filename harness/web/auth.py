"""Who may talk to the API: one shared bearer token, as notebook servers do.

Scripts send ``Authorization: Bearer <token>``. A browser cannot add that
header to a page load, so ``GET /login?token=...`` trades the token for a
cookie (HttpOnly, so page scripts never see it; SameSite=Strict, so another
site's page does not send it). A cookie is sent by the browser whoever asked
for the request, so a state-changing request authenticated by the cookie
alone must also carry ``X-Harness-Request: 1``: a custom header that a
cross-site form cannot add and a cross-site script cannot send without a CORS
preflight, which this app never grants. Only ``/healthz`` and the login form
answer without a token.
"""

from __future__ import annotations

import hmac
import html

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

#: The dashboard's session cookie: the token itself.
COOKIE = "harness_token"
#: The header that a cookie-authenticated POST must carry (the CSRF guard).
CSRF_HEADER = "x-harness-request"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

bearer = HTTPBearer(auto_error=False, description="The token of HARNESS_API_TOKEN")


class Guard:
    """Checks requests against the one token, in constant time."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the API token must not be empty")
        self._token = token.encode()

    def matches(self, candidate: str | None) -> bool:
        """Whether ``candidate`` is the token (compared in constant time)."""
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._token)

    def check(self, request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
        """Raise 401 unless the request carries the token; 403 for a
        cookie-authenticated write without the CSRF header."""
        if credentials is not None and self.matches(credentials.credentials):
            return
        if self.matches(request.cookies.get(COOKIE)):
            if request.method not in _SAFE_METHODS and request.headers.get(CSRF_HEADER) != "1":
                raise HTTPException(403, f"a write from the dashboard needs {CSRF_HEADER}: 1")
            return
        raise HTTPException(
            401,
            "a token is needed: Authorization: Bearer <HARNESS_API_TOKEN>",
            headers={"WWW-Authenticate": "Bearer"},
        )


def dependency(guard: Guard):  # type: ignore[no-untyped-def]  # FastAPI reads the signature
    """The FastAPI dependency that applies ``guard`` to a route."""

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
