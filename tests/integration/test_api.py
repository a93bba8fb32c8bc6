"""The HTTP API against a real ``harness serve`` process and real workers.

A real HTTP client (httpx) talks to the server over loopback; the runs move
on a real ``celery worker`` on the embedded default (SQLite + filesystem
broker), so nothing here needs a service. schemathesis fuzzes every
operation of ``/openapi.json`` and checks that no answer is a 5xx and that
every answer matches the schema.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.inputs import MAX_GOAL
from tests.apiserver import ApiServer
from tests.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def embedded(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster("filesystem")


#: The API takes callbacks of deferred calls (POST /api/callbacks/{token}).
CALLBACK_SECRET = "callback-secret-for-the-api-tests"


@pytest.fixture
def server(embedded: Cluster) -> Iterator[ApiServer]:
    s = ApiServer({**embedded.env, "HARNESS_CALLBACK_SECRET": CALLBACK_SECRET}, embedded.home)
    yield s
    s.stop()


def cli_json(*args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_nothing_but_healthz_answers_without_the_token(server: ApiServer) -> None:
    """Nothing but /healthz, and callback URLs, whose signed token is their
    authority (tests/unit/test_api_waits.py)."""
    with server.client() as client:
        schema = client.get("/openapi.json").json()
    paths = [path.replace("{run_id}", "some-run") for path in schema["paths"]]
    assert "/api/runs" in paths and "/metrics" in paths
    assert "/api/callbacks/{token}" in paths
    paths = [p for p in paths if not p.startswith("/api/callbacks/")]
    with server.client(anonymous=True) as anonymous:
        forged = anonymous.post("/api/callbacks/forged.token", json={"ok": True})
    assert forged.status_code == 401
    assert forged.json()["detail"] == "the callback token's signature does not match"
    pages = ["/", "/runs/some-run", "/static/style.css", "/openapi.json"]
    with server.client(anonymous=True) as anonymous, server.client(token="wrong") as wrong:
        assert anonymous.get("/healthz").json() == {"ok": True, "store": "ok"}
        for path in [p for p in paths if p != "/healthz"] + pages:
            for client in (anonymous, wrong):
                for method in ("GET", "POST"):
                    answer = client.request(method, path)
                    assert answer.status_code in (401, 405), (method, path, answer.text)
                    if answer.status_code == 401 and path.startswith("/api"):
                        assert "token" in answer.json()["detail"]
        # A browser without the cookie is shown the login form instead.
        page = anonymous.get("/", headers={"Accept": "text/html"})
        assert page.status_code == 401 and '<form method="post" action="/login">' in page.text


def test_a_generated_token_logs_a_browser_in_and_guards_its_writes(embedded: Cluster) -> None:
    s = ApiServer(embedded.env, embedded.home, token=None)
    try:
        assert "HARNESS_API_TOKEN is not set" in s.output
        login = next(line for line in s.lines if "log in at" in line).split("log in at ")[1]
        assert login.startswith(s.url + "/login?token=")
        with httpx.Client(base_url=s.url) as browser:
            assert browser.get("/login?token=not-it").status_code == 401
            answer = browser.get(login.removeprefix(s.url))
            assert answer.status_code == 303 and answer.headers["location"] == "/"
            cookie = answer.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=strict" in cookie
            assert browser.get("/api/runs").status_code == 200
            assert browser.get("/").status_code == 200
            # A write carried by the cookie alone could come from another site's form.
            forged = browser.post("/api/runs/some-run/cancel")
            assert forged.status_code == 403
            marked = browser.post("/api/runs/some-run/cancel", headers={"X-Harness-Request": "1"})
            assert marked.status_code == 404 and "some-run" in marked.json()["detail"]
        token = login.split("token=")[1]
        with httpx.Client(base_url=s.url) as browser:  # the form posts the token instead
            assert browser.post("/login", data={"token": "not-it"}).status_code == 401
            answer = browser.post("/login", data={"token": token})
            assert answer.status_code == 303 and browser.get("/api/stats").status_code == 200
        logins = [line for line in s.lines if "/login?token=" in line and "log in at" not in line]
        assert logins and all(token not in line and "<redacted>" in line for line in logins)
    finally:
        s.stop()


def test_a_run_started_watched_and_approved_through_the_api(
    embedded: Cluster, server: ApiServer
) -> None:
    embedded.worker()
    with server.client() as api:
        body = {"agent": "approver", "goal": "charge three", "run_id": "api-run-1"}
        assert api.post("/api/runs", json=body).status_code == 201
        again = api.post("/api/runs", json=body)
        assert (again.status_code, again.json()) == (200, {"run_id": "api-run-1"})
        other = api.post("/api/runs", json={**body, "goal": "something else"})
        assert other.status_code == 409

        def listed() -> dict[str, Any]:
            page = api.get("/api/runs", params={"agent": "approver"}).json()
            return {r["run_id"]: r for r in page["runs"]}["api-run-1"]

        def awaits(step: int) -> bool:
            run = listed()
            return run["attention"] == "awaiting_approval" and run["cursor"] == step

        for step in (1, 2, 3):
            embedded.wait_until(f"call {step} to await approval", lambda s=step: awaits(s))
            approved = api.post("/api/runs/api-run-1/approve", json={})
            assert approved.status_code == 200, approved.text
        embedded.wait_until(
            "the run to complete", lambda: listed()["status"] == "completed", timeout=60
        )

        shown = api.get("/api/runs/api-run-1").json()
        assert shown == cli_json("show", "api-run-1")
        assert [s["approval"]["by"] for s in shown["steps"][1:4]] == ["api"] * 3
        header = api.get("/api/runs/api-run-1", params={"steps": "false"}).json()
        assert "steps" not in header and header["attention"] is None

        # The timeline a window at a time, and the history a page at a time.
        windows, start = [], 0
        while start is not None:
            page = api.get("/api/runs/api-run-1/steps", params={"start": start, "limit": 2}).json()
            windows += page["steps"]
            start = page["next_start"]
        assert windows == shown["steps"] and page["total"] == len(shown["steps"])
        events, after = [], None
        while True:
            params = {"limit": 3} | ({} if after is None else {"after": after})
            page = api.get("/api/runs/api-run-1/history", params=params).json()
            events += page["events"]
            if page["next_after"] is None:
                break
            after = page["next_after"]
        assert events == cli_json("history", "api-run-1")
        assert [e["version"] for e in events] == sorted(e["version"] for e in events)


def test_a_list_pages_by_cursor_and_a_cancel_stops_a_run(
    embedded: Cluster, server: ApiServer
) -> None:
    with server.client() as api:  # no worker: the runs stay pending
        for i in range(5):
            created = api.post("/api/runs", json={"agent": "chain", "goal": f"run {i}"})
            assert created.status_code == 201
        seen, cursor = [], None
        while True:
            params = {"limit": 2} | ({} if cursor is None else {"cursor": cursor})
            page = api.get("/api/runs", params=params).json()
            seen += [r["goal"] for r in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [f"run {i}" for i in reversed(range(5))]
        run_id = api.get("/api/runs", params={"limit": 1}).json()["runs"][0]["run_id"]
        cancelled = api.post(f"/api/runs/{run_id}/cancel", json={"reason": "not needed"})
        assert cancelled.json()["status"] == "cancelled"
        assert api.get("/api/runs", params={"status": "cancelled"}).json()["runs"][0]["error"] == (
            "not needed"
        )
        assert api.get("/api/runs", params={"forked_from": run_id}).json()["runs"] == []
        stats = api.get("/api/stats").json()
        assert stats["runs_by_status"] == {"pending": 4, "cancelled": 1}


BAD_REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/api/runs", {"agent": "no-such-agent", "goal": "g"}),
    ("POST", "/api/runs", {"agent": "chain"}),
    ("POST", "/api/runs", {"agent": "chain", "goal": "g", "run_id": "a/b"}),
    ("POST", "/api/runs", {"agent": "chain", "goal": "g", "colour": "red"}),
    ("POST", "/api/runs", {"agent": "chain", "goal": "x" * (MAX_GOAL + 1)}),
    ("POST", "/api/runs", "not json at all"),
    ("POST", "/api/runs", ["a", "list"]),
    ("GET", "/api/runs?status=sleeping", None),
    ("GET", "/api/runs?limit=0", None),
    ("GET", "/api/runs?limit=1001", None),
    ("GET", "/api/runs?cursor=not-a-cursor", None),
    ("GET", "/api/runs?created_after=yesterday", None),
    ("GET", "/api/runs/nope", None),
    ("GET", "/api/runs/nope/history?after=-1", None),
    ("GET", "/api/runs/nope/steps", None),
    ("POST", "/api/runs/nope/cancel", {}),
    ("POST", "/api/runs/nope/resolve", {"decision": "maybe"}),
    ("POST", "/api/runs/nope/resume", {"max_tokens": -5}),
    ("POST", "/api/runs/nope/reject", {}),
    ("DELETE", "/api/runs", None),
    ("GET", "/api/nothing-here", None),
    ("GET", "/static/../../etc/passwd", None),
]


@pytest.mark.parametrize(("method", "path", "body"), BAD_REQUESTS)
def test_bad_input_gets_a_4xx_with_a_message(
    server: ApiServer, method: str, path: str, body: Any
) -> None:
    with server.client() as api:
        content = body if isinstance(body, str) else None
        data = None if isinstance(body, str) or body is None else body
        answer = api.request(method, path, json=data, content=content)
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and detail and "Traceback" not in detail


def test_an_operator_action_that_does_not_apply_is_a_conflict(server: ApiServer) -> None:
    with server.client() as api:
        api.post("/api/runs", json={"agent": "chain", "goal": "g", "run_id": "idle"})
        actions = (("approve", {}), ("reject", {"reason": "no"}), ("resume", {"max_tokens": 5}))
        for action, body in actions:
            answer = api.post(f"/api/runs/idle/{action}", json=body)
            assert answer.status_code == 409, (action, answer.text)
        resolved = api.post("/api/runs/idle/resolve", json={"decision": "retry"})
        assert resolved.status_code == 409


def test_schemathesis_finds_no_server_error_and_no_schema_mismatch(
    server: ApiServer, tmp_path: Path
) -> None:
    with server.client() as api:  # a few runs, so the reads return something real
        for i in range(3):
            api.post("/api/runs", json={"agent": "chain", "goal": f"g{i}", "run_id": f"r{i}"})
    schemathesis = Path(sys.executable).parent / "schemathesis"
    checks = "not_a_server_error,response_schema_conformance,content_type_conformance"
    done = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{server.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {server.token}",
            "--checks",
            checks + ",status_code_conformance",
            "--max-examples",
            "8",
            "--seed",
            "7",
            "--request-timeout",
            "30",
            # The event stream of a moving run lasts as long as the run: a generic
            # request would wait out its timeout. Its own tests: test_stream_workers.
            "--exclude-path",
            "/api/runs/{run_id}/events",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Traceback" not in server.output
