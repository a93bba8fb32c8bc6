"""The examples run as documented: the offline one on its scripted model, the
real-provider one through the OpenAI SDK against the local wire-format server,
the ones that wait on the world (a courier's callback, a signal, a sleep, a
child run) on the in-memory store, the courier a real HTTP server."""

from __future__ import annotations

import importlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.engine import recovery, waits
from harness.engine.creation import create_run
from harness.engine.operations import decide
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus, StepStatus
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.rig import Rig
from tests.wire import WireServer

GOAL = "What should I wear in Oslo and in Lisbon today?"


def test_the_offline_example(sqlite_store: SQLStore) -> None:
    importlib.import_module("examples.offline")
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "weather-offline", GOAL)
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED
    assert [s.result["sky"] for s in sqlite_store.steps(run_id)[1:3]] == ["snow", "sunny"]


def test_the_real_provider_example(sqlite_store: SQLStore, wire: WireServer) -> None:
    wire.script(
        GOAL,
        [
            {
                "tool_calls": [
                    {"name": "current_weather", "args": {"city": "Oslo"}},
                    {"name": "current_weather", "args": {"city": "Atlantis"}},
                ]
            },
            {"text": "A coat for Oslo; I have no weather for Atlantis."},
        ],
    )
    importlib.reload(importlib.import_module("examples.weather"))  # built with this env
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "weather", GOAL)
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    steps = sqlite_store.steps(run_id)
    assert steps[2].status is StepStatus.FAILED  # the unknown city went back as an error
    first = wire.requests[0].body
    assert first["model"] == "gpt-4.1-mini"
    assert first["messages"][0]["role"] == "system"
    assert first["tools"][0]["function"]["name"] == "current_weather"


def test_the_structured_answer_example_plays_its_wire_script(
    sqlite_store: SQLStore, wire: WireServer
) -> None:
    """The README's "Structured answers" output: the first answer names
    nothing to wear and goes back to the model; the second is the result."""
    script = json.loads((Path(__file__).parents[2] / "examples" / "outfit_wire.json").read_text())
    for goal, turns in script.items():
        wire.script(goal, turns)
    importlib.reload(importlib.import_module("examples.outfit"))  # built with this env
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "outfit", "What should I wear in Oslo today?")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    assert json.loads(run.result or "") == {
        "city": "Oslo",
        "celsius": -3.0,
        "wear": ["winter coat", "hat", "boots"],
    }
    invalid = sqlite_store.steps(run_id)[2].result
    assert isinstance(invalid, dict)
    assert invalid["invalid"] == (
        "1 validation error for Outfit: wear: Value error, name at least one thing to wear "
        "(given [])"
    )
    assert wire.requests[0].body["response_format"]["json_schema"]["name"] == "Outfit"


def test_the_approvals_example(sqlite_store: SQLStore) -> None:
    importlib.import_module("examples.approvals")
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "refunds", "refund orders 1234 and 5678")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.WAITING
    assert sqlite_store.steps(run_id)[1].status is StepStatus.AWAITING_APPROVAL
    rt = rig.runtime()
    decide(rt, run_id, approve=True, who="alice")
    decide(rt, run_id, approve=False, who="alice", step_index=2, reason="ask first")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert sqlite_store.steps(run_id)[2].error == "rejected by alice: ask first"


SECRET = "s" * 32


class CallbackDoor:
    """A stand-in for ``harness serve``'s ``POST /api/callbacks/{token}``
    (harness.web; tested with the real server in tests/integration): the
    body given to :func:`harness.engine.waits.callback` on this rig."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        door = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                token = self.path.rsplit("/", 1)[1]
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                waits.callback(door.rig.runtime("serve"), token, body, None)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_courier_example_is_called_back_once(
    memory_store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    courier_example = importlib.import_module("examples.courier")
    rig = Rig(memory_store)
    door = CallbackDoor(rig)
    rig.options = {"callback_secret": SECRET, "public_url": door.url}
    try:
        with courier_example.Courier() as courier:
            monkeypatch.setenv("COURIER_URL", courier.url)
            run_id = create_run(rig.runtime(), "courier", "ship parcel P-1 to 1 Main St")
            rig.drive()
            courier.wait_for_callbacks()  # it may have called back before the step deferred
            rig.drive()
            assert rig.load(run_id).status is RunStatus.COMPLETED
            step = memory_store.steps(run_id, 1, 1)[0]
            assert step.result == {"tracking": "TRK-1", "parcel": "P-1"}
            assert list(courier.bookings) == [f"{run_id}:1"]  # the step's idempotency key
            assert courier.book(courier.bookings[f"{run_id}:1"]) is False  # a retry: no 2nd
    finally:
        door.close()


def test_the_signal_and_sleep_examples(memory_store: MemoryStore) -> None:
    importlib.import_module("examples.waiting")
    rig = Rig(memory_store)
    rt = rig.runtime()
    paying = create_run(rt, "payments", "collect payment for order 1234")
    assert rig.drive()[-1] is TaskResult.WAITING
    sent = waits.signal(rt, paying, "paid", {"amount_cents": 4200}, signal_id="pay_8841")
    assert sent.delivery is waits.Delivery.ANSWERED
    again = waits.signal(rt, paying, "paid", {"amount_cents": 4200}, signal_id="pay_8841")
    assert again.delivery is waits.Delivery.ALREADY
    rig.drive()
    assert rig.load(paying).status is RunStatus.COMPLETED
    assert memory_store.steps(paying, 1, 1)[0].result == {"amount_cents": 4200}

    resting = create_run(rt, "follow-up", "check on the ticket tomorrow")
    assert rig.drive()[-1] is TaskResult.WAITING
    rig.clock.advance(86400 + 1)
    recovery.sweep(rig.runtime("sweeper"))
    rig.drive()
    assert rig.load(resting).status is RunStatus.COMPLETED
    assert memory_store.steps(resting, 1, 1)[0].result == {"slept": 86400}


def test_the_delegation_example(memory_store: MemoryStore) -> None:
    importlib.import_module("examples.delegation")
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), "planner", "plan a weekend in Lisbon")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    children = memory_store.children(run_id)
    assert [c.run_id for c in children] == [f"{run_id}:1", f"{run_id}:2"]
    assert {c.status for c in children} == {RunStatus.COMPLETED}
    found = memory_store.steps(run_id, 1, 1)[0].result
    assert found == "Tram 28, Belem, and a pastel de nata."


def test_the_conversation_example(memory_store: MemoryStore) -> None:
    from harness.engine import conversation

    importlib.import_module("examples.chat")
    rig = Rig(memory_store)
    rt = rig.runtime()
    run_id = create_run(rt, "trip-planner", "Plan me a weekend away")
    rig.drive()
    assert rig.load(run_id).result == "Gladly. Somewhere warm, or somewhere cold?"
    assert (
        conversation.send_message(rt, run_id, "Somewhere cold, by the sea").outcome == "continued"
    )
    rig.drive()
    assert rig.load(run_id).result.startswith("Then Tromsø")


def test_the_async_example_keeps_its_client_on_the_threads_loop(sqlite_store: SQLStore) -> None:
    importlib.import_module("examples.async_tools")
    rig = Rig(sqlite_store)
    first = create_run(rig.runtime(), "forecaster", "Oslo or Lisbon for the weekend?")
    second = create_run(rig.runtime(), "forecaster", "Oslo or Lisbon for the weekend?")
    rig.drive()
    for run_id in (first, second):
        assert rig.load(run_id).result == "Lisbon: 17 C and sunny, against -3 C and snow in Oslo."
    made = [
        s.result["client_requests"] for r in (first, second) for s in sqlite_store.steps(r)[1:3]
    ]
    assert sorted(made) == [1, 2, 3, 4]  # one client, this thread's, served all four calls
