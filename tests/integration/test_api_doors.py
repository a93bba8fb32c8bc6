"""The HTTP doors of a real ``harness serve`` process: who gets in before a
body is read, how much body anyone may send, what a token refused says, and
what the access log keeps of a login URL.

Memory is read from the server's own /proc/<pid>/status (VmHWM, the peak
resident size), so a body that is buffered even for a moment shows up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from harness import callbacks
from tests.apiserver import ApiServer
from tests.cluster import Cluster
from tests.web import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: What the server signs callback URLs with, and this test signs one with.
SECRET = "a-callback-secret-for-the-doors"

MB = 1 << 20
#: A body far larger than any limit: what an attacker, or a runaway script, sends.
HUGE = 200 * MB
#: How much the server may grow while such bodies are refused: nothing near their size.
GROWTH = 50 * MB


@pytest.fixture
def server(make_cluster: Callable[..., Cluster]) -> Iterator[ApiServer]:
    embedded = make_cluster("filesystem")
    s = ApiServer({**embedded.env, "HARNESS_CALLBACK_SECRET": SECRET}, embedded.home)
    yield s
    s.stop()


def peak_rss(pid: int) -> int:
    """The process's peak resident set size, bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def stream(total: int, chunk: int = MB) -> Iterator[bytes]:
    """``total`` bytes, a chunk at a time: the client holds one chunk, never the body."""
    block = b"x" * chunk
    sent = 0
    while sent < total:
        piece = block[: min(chunk, total - sent)]
        sent += len(piece)
        yield piece


def test_a_huge_body_is_refused_without_the_server_holding_it(server: ApiServer) -> None:
    with server.client() as api:
        assert api.post(
            "/api/runs", json={"agent": "chain", "goal": "g", "run_id": "r1"}
        ).is_success
    before = peak_rss(server.proc.pid)
    with server.client(anonymous=True) as anonymous, server.client() as api:
        # No token: refused before a byte of the body is read, chunked or declared.
        chunked = anonymous.post("/api/runs/r1/cancel", content=stream(HUGE))
        assert chunked.status_code == 401, chunked.text
        declared = anonymous.post(
            "/api/runs/r1/cancel",
            content=stream(HUGE),
            headers={"Content-Length": str(HUGE), "Content-Type": "application/json"},
        )
        assert declared.status_code == 401, declared.text
        # The login form is open, and reads a few kilobytes at most.
        login = anonymous.post(
            "/login", content=stream(HUGE), headers={"Content-Type": "text/plain"}
        )
        assert login.status_code == 413, login.text
        # A callback URL is open too (its signed token is the authority): a
        # forged token is refused before its body is read; a signed one's
        # body is cut off at the API's limit, chunked or declared, never held.
        signed = callbacks.sign(SECRET, callbacks.CallbackClaim("r1", 1, 1, time.time() + 60))
        for token, status in (("some.token", 401), (signed, 413)):
            for headers in ({}, {"Content-Length": str(HUGE)}):
                callback = anonymous.post(
                    f"/api/callbacks/{token}",
                    content=stream(HUGE),
                    headers={**headers, "Content-Type": "application/json"},
                )
                assert callback.status_code == status, callback.text
        # With the token: a declared length over the limit is refused at once...
        too_long = api.post(
            "/api/runs",
            content=stream(HUGE),
            headers={"Content-Length": str(HUGE), "Content-Type": "application/json"},
        )
        assert too_long.status_code == 413, too_long.text
        # ...and a chunked body is cut off once it passes the limit.
        streamed = api.post(
            "/api/runs", content=stream(HUGE), headers={"Content-Type": "application/json"}
        )
        assert streamed.status_code == 413, streamed.text
        assert "HARNESS_API_MAX_BODY" in streamed.json()["detail"]
        # The connection lives on: the refused body was drained, not left in the way.
        assert api.get("/api/runs/r1", params={"steps": "false"}).status_code == 200
    grown = peak_rss(server.proc.pid) - before
    print(f"the server grew by {grown / MB:.1f} MB while refusing {7 * HUGE / MB:,.0f} MB")
    assert grown < GROWTH, f"the server grew by {grown / MB:.0f} MB"


def test_the_body_limit_is_the_setting_and_a_body_under_it_works(
    make_cluster: Callable[..., Cluster],
) -> None:
    embedded = make_cluster("filesystem", HARNESS_API_MAX_BODY="4096")
    s = ApiServer(embedded.env, embedded.home)
    try:
        with s.client() as api:
            under = api.post("/api/runs", json={"agent": "chain", "goal": "g" * 3000})
            assert under.status_code == 201, under.text
            over = api.post("/api/runs", json={"agent": "chain", "goal": "g" * 5000})
            assert over.status_code == 413
            assert over.json() == {
                "detail": "the request body is larger than HARNESS_API_MAX_BODY (4,096 bytes)"
            }
            chunked = api.post(
                "/api/runs",
                content=stream(5000, chunk=1000),
                headers={"Content-Type": "application/json"},
            )
            assert chunked.status_code == 413 and "4,096 bytes" in chunked.json()["detail"]
    finally:
        s.stop()


def test_a_wrong_token_is_told_apart_from_a_missing_one(server: ApiServer) -> None:
    missing = "a token is needed: Authorization: Bearer <HARNESS_API_TOKEN>"
    wrong = "that token is not the right one: Authorization: Bearer <HARNESS_API_TOKEN>"
    with server.client(anonymous=True) as anonymous, server.client(token="not-it") as other:
        for method, path in (("GET", "/api/runs"), ("POST", "/api/runs/r1/cancel")):
            none = anonymous.request(method, path)
            assert (none.status_code, none.json()) == (401, {"detail": missing})
            assert none.headers["www-authenticate"] == "Bearer"
            bad = other.request(method, path, json={})
            assert (bad.status_code, bad.json()) == (401, {"detail": wrong})
        # A browser whose login cookie holds another token (the server's changed).
        anonymous.cookies.set("harness_token", "an-old-token")
        stale = anonymous.get("/api/runs")
        assert stale.status_code == 401 and "log in again" in stale.json()["detail"]
        page = anonymous.get("/", headers={"Accept": "text/html"})
        assert page.status_code == 401 and "log in again" in page.text
        anonymous.cookies.clear()
        # The login form: a wrong token, and none.
        refused = anonymous.post("/login", data={"token": "not-it"})
        assert refused.status_code == 401 and "That token is not the right one." in refused.text
        empty = anonymous.post("/login", data={})
        assert empty.status_code == 401 and "A token is needed." in empty.text
        first = anonymous.get("/", headers={"Accept": "text/html"})
        assert first.status_code == 401 and 'class="error"' not in first.text


def test_a_login_token_never_reaches_the_access_log_whatever_its_spelling(
    server: ApiServer,
) -> None:
    assert server.token is not None
    spellings = ["token", "%74oken", "%74%6F%6B%65%6E", "tok%65n"]
    with httpx.Client(base_url=server.url) as browser:
        for name in spellings:
            answer = browser.get(f"/login?{name}={server.token}")
            assert answer.status_code == 303, (name, answer.text)  # each one logs in

    def logged() -> list[str]:
        lines = [line for line in server.lines if "GET /login?" in line]
        return lines if len(lines) == len(spellings) else []

    lines = wait_for("the access log of each login", logged, timeout=10)
    assert all(server.token not in line and "=<redacted>" in line for line in lines), lines


def test_the_icon_is_served_to_anyone(server: ApiServer) -> None:
    with server.client(anonymous=True) as anonymous:
        icon = anonymous.get("/favicon.ico")
    assert icon.status_code == 200, icon.text
    assert icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg ")
