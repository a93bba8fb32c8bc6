"""Agents that wait on the world and delegate, for the tests of waits with
real workers (tests/integration/test_waits_workers.py, the chaos suite).
Workers import it through HARNESS_IMPORTS (:data:`IMPORTS`).

Each tool writes the external ledger (``HARNESS_TEST_LEDGER``) as the tools
of tests/agents.py do, so a test counts its calls from outside the worker;
the courier also writes each callback URL it was given to
:func:`urls_path`, where the test (playing the courier) finds it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import harness
from tests.agents import effect
from tests.ledger import append

#: HARNESS_IMPORTS for a cluster that carries these agents (and tests/agents.py's).
IMPORTS = "tests.agents,tests.wait_agents"
#: HARNESS_CALLBACK_SECRET of those clusters: the workers sign with it, the test verifies.
SECRET = "a-test-secret-of-some-length"
#: The settings such a cluster needs, as make_cluster's keyword arguments.
ENV = {"HARNESS_IMPORTS": IMPORTS, "HARNESS_CALLBACK_SECRET": SECRET}


def _ledger() -> str:
    return os.environ["HARNESS_TEST_LEDGER"]


def urls_path(ledger: Path | str) -> Path:
    """Where the courier writes the callback URLs it hands out: ``key url`` lines."""
    return Path(f"{ledger}.callbacks")


def callback_urls(ledger: Path | str) -> list[tuple[str, str]]:
    """The (idempotency key, callback URL) pairs handed out so far, oldest first."""
    path = urls_path(ledger)
    if not path.exists():
        return []
    pairs = []
    for line in path.read_text().splitlines():
        key, url = line.split(" ", 1)
        pairs.append((key, url))
    return pairs


@harness.tool(effect="idempotent")
def courier(parcel: str, ctx: harness.ToolContext, timeout: float = 600.0) -> harness.Deferred:
    """Ask the courier to ship ``parcel``: it calls back on the URL it is given."""
    append(_ledger(), "start", ctx.idempotency_key)
    line = f"{ctx.idempotency_key} {ctx.callback_url()}\n".encode()
    fd = os.open(urls_path(_ledger()), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    append(_ledger(), "end", ctx.idempotency_key)
    return harness.Deferred(timeout=timeout)


@harness.tool(effect="idempotent")
def await_payment(ctx: harness.ToolContext) -> harness.Deferred:
    """Wait for the payment provider's signal ``paid``."""
    append(_ledger(), "start", ctx.idempotency_key)
    append(_ledger(), "end", ctx.idempotency_key)
    return harness.Deferred(timeout=600, signal="paid")


@harness.tool(effect="idempotent")
def nap(seconds: float, ctx: harness.ToolContext) -> harness.Sleep:
    """Sleep durably: the step wakes after ``seconds`` with no worker holding it."""
    append(_ledger(), "start", ctx.idempotency_key)
    append(_ledger(), "end", ctx.idempotency_key)
    return harness.Sleep(seconds)


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


class Metered:
    """A scripted model that reports usage like a provider's: 100 tokens in
    and 50 out each turn, and reserves as much before it (the pattern of
    tests/unit/test_control.py)."""

    name = "test:metered"
    records_responses = False

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.scripted = harness.ScriptedModel(turns)

    def reserve(self, request: harness.ModelRequest) -> harness.Usage:
        return harness.Usage(100, 50)

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        turn = self.scripted.next_turn(request)
        return harness.ModelTurn(
            final=turn.final, tool_calls=turn.tool_calls, usage=harness.Usage(100, 50)
        )


class Patient:
    """Asks the courier with a 1.5 s timeout, then answers with what the call
    came to: the model, not the harness, decides what a timeout means."""

    name = "test:patient"
    records_responses = False

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        if request.turn == 0:
            call = harness.ToolCall("courier", {"parcel": "p9", "timeout": 1.5})
            return harness.ModelTurn(tool_calls=(call,))
        (step,) = [s for s in request.history() if s.kind == "tool"]
        if step.error is not None:
            return harness.ModelTurn(final=f"the courier never came back: {step.error}")
        return harness.ModelTurn(final=f"the courier came back: {step.result}")


harness.register_agent(
    harness.Agent(
        name="w-courier",
        model=harness.ScriptedModel([_call("courier", parcel="p1"), {"final": "shipped"}]),
        tools=[courier],
        max_attempts=20,  # the chaos suite may kill it several times
    )
)
harness.register_agent(harness.Agent(name="w-patient", model=Patient(), tools=[courier]))
harness.register_agent(
    harness.Agent(
        name="w-payer",
        model=harness.ScriptedModel([_call("await_payment"), {"final": "paid"}]),
        tools=[await_payment],
        max_attempts=20,
    )
)
harness.register_agent(
    harness.Agent(
        name="w-napper",
        model=harness.ScriptedModel([_call("nap", seconds=2), {"final": "rested"}]),
        tools=[nap],
        max_attempts=20,
    )
)

# A planner that hands two tasks to a researcher in one turn: two children at once.
harness.register_agent(
    harness.Agent(
        name="w-researcher",
        model=harness.ScriptedModel([_call("effect", n=1, seconds=2.0), {"final": "found it"}]),
        tools=[effect],
        max_attempts=20,
    )
)
harness.register_agent(
    harness.Agent(
        name="w-planner",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "w-researcher", "args": {"task": "find x"}},
                        {"name": "w-researcher-b", "args": {"task": "find y"}},
                    ]
                },
                {"final": "planned"},
            ]
        ),
        tools=[
            harness.agent_tool("w-researcher"),
            harness.agent_tool("w-researcher", name="w-researcher-b"),
        ],
        max_attempts=20,
    )
)

# A researcher that would take six turns (900 tokens) under a planner of 600:
# its budget is what the planner has left after its own first turn.
harness.register_agent(
    harness.Agent(
        name="w-hungry",
        model=Metered([*[_call("effect", n=i) for i in range(5)], {"final": "dug deep"}]),
        tools=[effect],
    )
)
harness.register_agent(
    harness.Agent(
        name="w-thrifty",
        model=Metered([_call("w-hungry", task="dig"), {"final": "dug"}]),
        tools=[harness.agent_tool("w-hungry")],
        max_tokens=600,
    )
)

# A planner whose child waits on a signal that never comes: cancelled from above.
harness.register_agent(
    harness.Agent(
        name="w-boss",
        model=harness.ScriptedModel([_call("w-payer", task="collect"), {"final": "collected"}]),
        tools=[harness.agent_tool("w-payer")],
    )
)
