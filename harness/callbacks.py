"""Signed callback tokens: the URL a deferred call gives the outside world
to answer it (``ctx.callback_url()``, ``POST /api/callbacks/{token}``).

A token names the run, the step, the attempt that made it and when it
expires, and carries an HMAC-SHA256 of those under HARNESS_CALLBACK_SECRET,
so the API can accept it without a bearer token: whoever holds the URL may
answer that one step, once, before it expires, and nothing else. It is
``<payload>.<signature>``, both base64url without padding; the payload is
compact JSON ``[run_id, step, attempt, expires]``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

from harness.errors import ConfigError, HarnessError

#: How long a callback URL is good for when the tool does not say: 30 days.
DEFAULT_EXPIRY = 30 * 24 * 3600.0
#: A token longer than this is not one of ours (a run id is at most 128 characters).
MAX_TOKEN = 1024


class BadToken(HarnessError):
    """A callback token that is not one this harness signed (forged, altered,
    signed with another secret, or not a token at all)."""


class ExpiredToken(HarnessError):
    """A callback token past its expiry."""


@dataclass(frozen=True)
class CallbackClaim:
    """What a valid token lets its holder answer."""

    run_id: str
    step: int
    attempt: int
    expires: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: str, payload: str) -> str:
    digest = hmac.new(secret.encode(), payload.encode("ascii"), hashlib.sha256).digest()
    return _b64(digest)


def _required(secret: str | None) -> str:
    if not secret:
        raise ConfigError(
            "callback URLs need HARNESS_CALLBACK_SECRET (16 characters or more, the same "
            "on every worker and API process) to sign them with"
        )
    return secret


def sign(secret: str | None, claim: CallbackClaim) -> str:
    """The token for ``claim``; ConfigError without a secret."""
    key = _required(secret)
    body = [claim.run_id, claim.step, claim.attempt, round(claim.expires, 3)]
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{payload}.{_signature(key, payload)}"


def verify(secret: str | None, token: str, now: float) -> CallbackClaim:
    """The claim ``token`` carries, if this harness signed it and it has not
    expired. Raises BadToken, ExpiredToken, or ConfigError without a secret."""
    key = _required(secret)
    if len(token) > MAX_TOKEN or not token.isascii() or token.count(".") != 1:
        raise BadToken("not a callback token")
    payload, signature = token.split(".")
    if not hmac.compare_digest(_signature(key, payload), signature):
        raise BadToken("the callback token's signature does not match")
    try:
        run_id, step, attempt, expires = json.loads(_unb64(payload))
    except (ValueError, TypeError, binascii.Error):
        raise BadToken("the callback token's payload is unreadable") from None
    claim = CallbackClaim(str(run_id), int(step), int(attempt), float(expires))
    if claim.expires <= now:
        raise ExpiredToken(f"the callback URL of run {claim.run_id} step {claim.step} has expired")
    return claim


def url(public_url: str, token: str) -> str:
    """The callback URL of ``token`` under the API's public address."""
    return f"{public_url}/api/callbacks/{token}"
