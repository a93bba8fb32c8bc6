"""The HTTP doors of runs that wait on the world, in process (FastAPI's test
client on SQLite): a callback URL answered with no bearer token, checked by
its signature and expiry, within the body limit; a completion and a signal
under the bearer token; each answer taken once, and what could not be
taken refused with the status the other routes use, writing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harness import api, callbacks
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus, StepStatus
from harness.web.app import create_app

TOKEN = "waits-test-token"
SECRET = "k" * 32


@pytest.fixture
def client(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path
) -> Iterator[TestClient]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents,tests.door_wait_agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_TEST_LEDGER", str(tmp_path / "ledger.txt"))
    monkeypatch.setenv("HARNESS_CALLBACK_SECRET", SECRET)
    monkeypatch.setenv("HARNESS_API_MAX_BODY", "65536")
    api.reset_runtime()
    with TestClient(create_app(TOKEN), headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c
    api.reset_runtime()


def waiting(agent: str) -> str:
    api.ensure_agents()
    run_id = api.start_run(agent, "go")
    for _ in range(10):
        if run_step(api.runtime(), run_id) is not TaskResult.ADVANCED:
            break
    assert api.get_run(run_id).status is RunStatus.WAITING
    return run_id


def token_of(run_id: str, step: int = 1, expires_in: float = 3600.0) -> str:
    """The token the call's callback URL carries (as ctx.callback_url signs it)."""
    now = api.runtime().clock.now()
    claim = callbacks.CallbackClaim(run_id, step, 1, now + expires_in)
    return callbacks.sign(SECRET, claim)


def stranger(client: TestClient, path: str, **kw: Any) -> Any:
    """A POST without the API token, as a courier's webhook makes it."""
    headers = {**kw.pop("headers", {}), "Authorization": ""}
    return client.post(path, headers=headers, **kw)


def test_a_callback_needs_no_bearer_token_and_answers_once(client: TestClient) -> None:
    run_id = waiting("d-shipper")
    path = f"/api/callbacks/{token_of(run_id)}"
    first = stranger(client, path, json={"tracking": "T1"})
    assert first.status_code == 200, first.text
    assert first.json() == {
        "run_id": run_id,
        "step": 1,
        "delivery": "answered",
        "changed": True,
        "said": "step 1 answered (callback)",
    }
    again = stranger(client, path, json={"tracking": "T2"})
    assert again.status_code == 200
    assert again.json()["changed"] is False and "nothing changed" in again.json()["said"]
    assert api.get_steps(run_id)[1].result == {"tracking": "T1"}


def test_a_callback_body_of_one_error_is_a_failed_call(client: TestClient) -> None:
    run_id = waiting("d-shipper")
    done = stranger(client, f"/api/callbacks/{token_of(run_id)}", json={"error": "lost"})
    assert done.status_code == 200, done.text
    step = api.get_steps(run_id)[1]
    assert (step.status, step.error) == (StepStatus.FAILED, "lost")


def test_a_callback_body_with_more_than_an_error_is_a_result(client: TestClient) -> None:
    run_id = waiting("d-shipper")
    body = {"error": "none", "code": 0}
    assert stranger(client, f"/api/callbacks/{token_of(run_id)}", json=body).status_code == 200
    assert api.get_steps(run_id)[1].result == body


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        "é.x",
        "a" * 2000,
        "{good}x",  # the signature altered
    ],
)
def test_a_forged_token_is_401_and_changes_nothing(client: TestClient, token: str) -> None:
    run_id = waiting("d-shipper")
    before = api.get_run(run_id)
    answer = stranger(client, f"/api/callbacks/{token.format(good=token_of(run_id))}", json=1)
    assert answer.status_code == 401, answer.text
    assert "token" in answer.json()["detail"]
    assert api.get_run(run_id) == before
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED


def test_an_expired_token_is_404(client: TestClient) -> None:
    run_id = waiting("d-shipper")
    answer = stranger(client, f"/api/callbacks/{token_of(run_id, expires_in=-1)}", json=1)
    assert answer.status_code == 404
    assert "has expired" in answer.json()["detail"]


def test_a_callback_without_a_secret_is_503_saying_so(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = waiting("d-shipper")
    token = token_of(run_id)
    monkeypatch.delenv("HARNESS_CALLBACK_SECRET")
    api.reset_runtime()
    answer = stranger(client, f"/api/callbacks/{token}", json=1)
    assert answer.status_code == 503
    assert "HARNESS_CALLBACK_SECRET" in answer.json()["detail"]


def test_a_callback_body_over_the_limit_is_413_before_the_token_is_looked_at(
    client: TestClient,
) -> None:
    run_id = waiting("d-shipper")
    body = b'"' + b"x" * 70_000 + b'"'
    answer = stranger(
        client,
        f"/api/callbacks/{token_of(run_id)}",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 413
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED


def test_only_callback_urls_are_open(client: TestClient) -> None:
    run_id = waiting("d-shipper")
    for path in (
        f"/api/runs/{run_id}/steps/1/complete",
        f"/api/callbacks/{token_of(run_id)}/x",
        f"/api/callbacks/x/../../runs/{run_id}/cancel",
    ):
        assert stranger(client, path, json={"result": 1}).status_code == 401, path


def test_complete_under_the_bearer_token(client: TestClient) -> None:
    run_id = waiting("d-shipper")
    path = f"/api/runs/{run_id}/steps/1/complete"
    done = client.post(path, json={"result": {"ok": True}, "by": "ops"})
    assert done.status_code == 200, done.text
    assert done.json()["said"] == "step 1 answered (completed by ops)"
    again = client.post(path, json={"error": "late"})
    assert again.status_code == 200 and again.json()["changed"] is False
    assert api.get_steps(run_id)[1].result == {"ok": True}


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("/api/runs/{run}/steps/1/complete", {}, 422, "exactly one of"),
        ("/api/runs/{run}/steps/1/complete", {"result": 1, "error": "x"}, 422, "exactly one"),
        ("/api/runs/{run}/steps/1/complete", {"error": None}, 422, "exactly one"),
        ("/api/runs/{run}/steps/1/complete", {"result": 1, "extra": 2}, 422, "extra"),
        ("/api/runs/{run}/steps/1/complete", {"error": "a\x00b"}, 422, "NUL"),
        ("/api/runs/{run}/steps/0/complete", {"result": 1}, 409, "model step"),
        ("/api/runs/{run}/steps/7/complete", {"result": 1}, 409, "no step 7"),
        ("/api/runs/{run}/steps/-1/complete", {"result": 1}, 422, "step"),
        ("/api/runs/nobody/steps/1/complete", {"result": 1}, 404, "nobody"),
    ],
)
def test_complete_refusals(
    client: TestClient, path: str, body: Any, status: int, detail: str
) -> None:
    run_id = waiting("d-shipper")
    answer = client.post(path.format(run=run_id), json=body)
    assert answer.status_code == status, answer.text
    assert detail in answer.json()["detail"]
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED


def test_a_complete_body_that_is_nan_is_refused(client: TestClient) -> None:
    run_id = waiting("d-shipper")
    answer = client.post(
        f"/api/runs/{run_id}/steps/1/complete",
        content=b'{"result": [NaN]}',
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422 and "nan" in answer.json()["detail"].lower()
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED


def test_a_signal_with_an_idempotency_key_is_received_once(client: TestClient) -> None:
    run_id = waiting("d-payer")
    path = f"/api/runs/{run_id}/signals/paid"
    sent = client.post(path, json={"amount": 5}, headers={"Idempotency-Key": "tx-1"})
    assert sent.status_code == 200, sent.text
    assert sent.json()["delivery"] == "answered" and sent.json()["step"] == 1
    again = client.post(path, json={"amount": 6}, headers={"Idempotency-Key": "tx-1"})
    assert again.status_code == 200 and again.json()["delivery"] == "already"
    assert api.get_steps(run_id)[1].result == {"amount": 5}


def test_a_signal_no_step_asks_for_is_kept(client: TestClient) -> None:
    run_id = waiting("d-payer")
    sent = client.post(f"/api/runs/{run_id}/signals/later")
    assert sent.status_code == 200, sent.text
    assert sent.json()["delivery"] == "kept"
    assert api.runtime().store.kept_signals(run_id)[0].data is None


@pytest.mark.parametrize(
    ("name", "body", "key", "status", "detail"),
    [
        ("x" * 201, 1, None, 422, "name"),
        ("a%09b", 1, None, 422, "printable"),
        ("paid", 1, "k" * 201, 422, "Idempotency-Key"),
        ("paid", b"[NaN]", None, 422, "nan"),
        ("paid", b"[" * 100 + b"]" * 100, None, 422, "deeper"),
        # Deeper than Python's parser goes: refused as every route refuses it.
        ("paid", b"[" * 5000 + b"]" * 5000, None, 400, "error parsing the body"),
    ],
)
def test_signal_refusals_keep_nothing(
    client: TestClient, name: str, body: Any, key: str | None, status: int, detail: str
) -> None:
    run_id = waiting("d-payer")
    headers = {"Content-Type": "application/json"} | (
        {} if key is None else {"Idempotency-Key": key}
    )
    content = body if isinstance(body, bytes) else str(body).encode()
    answer = client.post(f"/api/runs/{run_id}/signals/{name}", content=content, headers=headers)
    assert answer.status_code == status, answer.text
    assert detail.lower() in answer.json()["detail"].lower()
    assert api.runtime().store.kept_signals(run_id) == []
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED


def test_a_signal_to_an_ended_run_is_409(client: TestClient) -> None:
    run_id = waiting("d-payer")
    assert client.post(f"/api/runs/{run_id}/cancel").status_code == 200
    answer = client.post(f"/api/runs/{run_id}/signals/paid", json=1)
    assert answer.status_code == 409 and answer.json()["status"] == "cancelled"


def test_the_new_routes_are_documented(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    callback = paths["/api/callbacks/{token}"]["post"]
    assert callback["security"] == []
    assert {"200", "401", "404", "413", "422", "503"} <= set(callback["responses"])
    for path in ("/api/runs/{run_id}/steps/{step}/complete", "/api/runs/{run_id}/signals/{name}"):
        responses = paths[path]["post"]["responses"]
        assert {"200", "404", "409", "422"} <= set(responses)
    assert "Delivered" in schema["components"]["schemas"]


def test_a_message_continues_a_completed_run_and_a_cancelled_one_is_409(
    client: TestClient,
) -> None:
    api.ensure_agents()
    run_id = api.start_run("chain", "go")
    for _ in range(10):
        if run_step(api.runtime(), run_id) is not TaskResult.ADVANCED:
            break
    assert api.get_run(run_id).status is RunStatus.COMPLETED
    sent = client.post(f"/api/runs/{run_id}/messages", json={"text": "go on"})
    assert sent.status_code == 200, sent.text
    assert sent.json() == {
        "run_id": run_id,
        "outcome": "continued",
        "said": "the run goes on with the message",
    }
    assert stranger(client, f"/api/runs/{run_id}/messages", json={"text": "x"}).status_code == 401
    assert client.post(f"/api/runs/{run_id}/messages", json={"text": ""}).status_code == 422
    assert client.post(f"/api/runs/{run_id}/messages", json={"txt": "x"}).status_code == 422
    api.cancel_run(run_id)
    refused = client.post(f"/api/runs/{run_id}/messages", json={"text": "hello?"})
    assert refused.status_code == 409 and "cancelled" in refused.json()["detail"]
    assert client.post("/api/runs/nope/messages", json={"text": "x"}).status_code == 404
