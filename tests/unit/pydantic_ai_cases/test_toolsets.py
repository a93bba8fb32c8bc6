"""A Pydantic AI agent's toolsets beyond its plain function tools, as harness
steps: an MCP server (our ledger server over stdio, through Pydantic AI's
own MCPToolset), a dynamic toolset, prefixed and filtered wrappers, an
approval-required wrapper; and its deferred calls (``CallDeferred``, an
external tool) as the harness's waits, answered by ``harness complete``.
On the embedded store, with the agent re-run from its start at each step
where it says so (as when its previous step was taken elsewhere)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent, CallDeferred, RunContext
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import DynamicToolset, ExternalToolset, FunctionToolset

import harness
from harness import api
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus, StepStatus
from tests.ledger import Ledger
from tests.unit.pydantic_ai_cases.common import drive

REPO = Path(__file__).resolve().parents[3]
#: Every call of a function tool, in order (the MCP server's go to its ledger).
CALLS: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("MCP_LEDGER", str(tmp_path / "mcp.ledger"))
    CALLS.clear()
    api.reset_runtime()
    yield
    api.reset_runtime()


def _ledger_server() -> MCPToolset[Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    transport = StdioTransport(sys.executable, ["-m", "tests.mcp_server"], env=env, cwd=str(REPO))
    return MCPToolset(transport, id="ledger", init_timeout=60)  # a busy machine starts it slowly


def _returns(messages: list[ModelMessage]) -> list[str]:
    last = messages[-1]
    return [str(p.content) for p in last.parts if isinstance(p, ToolReturnPart | RetryPromptPart)]


def _script(calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """A model that makes ``calls`` one a turn, then answers with what each returned."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        seen = [r for m in messages[1:] for r in _returns([m])]
        if turn < len(calls):
            name, args = calls[turn]
            return ModelResponse(parts=[ToolCallPart(name, args, f"c{turn}")])
        return ModelResponse(parts=[TextPart(" | ".join(seen))])

    return model


def _suite_agent(name: str) -> Agent[None, str]:
    """An MCP server, a prefixed and filtered function toolset, a dynamic toolset."""
    extra = FunctionToolset[None](id="extra")

    @extra.tool_plain
    def shout(word: str) -> str:
        CALLS.append(("shout", word))
        return word.upper()

    @extra.tool_plain
    def hidden() -> str:  # filtered out: never offered
        return "no"

    def dynamic(ctx: RunContext[None]) -> FunctionToolset[None]:
        made = FunctionToolset[None]()

        @made.tool_plain
        def count(n: int) -> int:
            CALLS.append(("count", n))
            return n + 1

        return made

    model = FunctionModel(
        _script(
            [
                ("weather", {"city": "oslo"}),
                ("x_shout", {"word": "hi"}),
                ("count", {"n": 41}),
                ("send", {"to": "ops", "text": "done"}),
            ]
        )
    )
    return Agent(
        model,
        name=name,
        toolsets=[
            _ledger_server().filtered(_mcp_subset),
            extra.filtered(lambda ctx, tool: tool.name != "hidden").prefixed("x"),
            DynamicToolset(dynamic, id="counting"),
        ],
    )


def _mcp_subset(ctx: RunContext[None], tool: ToolDefinition) -> bool:
    return tool.name in ("weather", "send")


def test_mcp_dynamic_and_wrapped_toolsets_run_as_steps_as_they_run_plainly(kept: str) -> None:
    plain = _suite_agent("suite-plain").run_sync("go").output
    assert CALLS == [("shout", "hi"), ("count", 41)]
    CALLS.clear()
    registered = harness.register_pydantic_ai(_suite_agent(f"suite-{kept}"))
    run_id = api.start_run(registered.name, "go")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert api.get_run(run_id).result == plain
    assert CALLS == [("shout", "hi"), ("count", 41)]  # each called once
    steps = api.get_steps(run_id)
    assert [s.tool for s in steps] == [
        None,
        "weather",
        None,
        "x_shout",
        None,
        "count",
        None,
        "send",
        None,
    ]
    # The server's acting tool was called once by the run, under its step's
    # key (and once by the plain run, with none).
    ledger = Ledger.read(Path(os.environ["MCP_LEDGER"]))
    assert [e.key for e in ledger.executions] == ["no-key", steps[7].idempotency_key]
    # The tools the run was offered are recorded, effects read from the annotations.
    recorded = api.runtime().store.offered_tools(run_id)
    assert isinstance(recorded, dict)
    effects = {t["name"]: t["effect"] for t in recorded["pydantic-ai"]}  # type: ignore[index, union-attr]
    assert effects == {
        "weather": "read_only",
        "send": "at_most_once",
        "x_shout": "idempotent",
        "count": "idempotent",
    }


def test_an_approval_required_toolset_waits_for_an_operator_on_every_call() -> None:
    tools = FunctionToolset[None](id="payments")

    @tools.tool_plain
    def pay(amount: int) -> str:
        CALLS.append(("pay", amount))
        return "paid"

    model = FunctionModel(_script([("pay", {"amount": 5}), ("pay", {"amount": 7})]))
    agent = Agent(model, name="payer-gated", toolsets=[tools.approval_required()])
    harness.register_pydantic_ai(agent)
    run_id = api.start_run("payer-gated", "pay twice")
    assert drive(run_id)[-1] is TaskResult.WAITING
    assert api.get_run(run_id).status is RunStatus.WAITING
    assert api.get_steps(run_id)[1].status is StepStatus.AWAITING_APPROVAL
    assert CALLS == []
    harness.approve(run_id, by="alice")
    assert drive(run_id)[-1] is TaskResult.WAITING
    assert CALLS == [("pay", 5)]
    harness.reject(run_id, "too much", by="bob")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert CALLS == [("pay", 5)]
    result = str(api.get_run(run_id).result)
    assert result.startswith("paid | ") and "too much" in result


def _hidden_gate(name: str) -> Agent[None, str]:
    def gated(ctx: RunContext[None]) -> Any:
        made = FunctionToolset[None]()

        @made.tool_plain
        def pay(amount: int) -> str:
            CALLS.append(("pay", amount))
            return "paid"

        return made.approval_required()  # inside a dynamic toolset: not known ahead

    model = FunctionModel(_script([("pay", {"amount": 5})]))
    return Agent(model, name=name, toolsets=[DynamicToolset(gated, id="gated")])


def test_a_call_that_asks_approval_the_harness_did_not_know_of_is_not_made(kept: str) -> None:
    harness.register_pydantic_ai(_hidden_gate(f"hidden-gate-{kept}"))
    run_id = api.start_run(f"hidden-gate-{kept}", "pay")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert CALLS == []  # never made without an operator's word
    assert "did not know to ask an operator for" in str(api.get_run(run_id).result)
    assert api.get_steps(run_id)[1].result == {
        "kind": "tool_failed",
        "message": "the tool asked for approval when called, which the harness did not know "
        "to ask an operator for: name it in requires_approval= (not called)",
    }


def test_named_in_requires_approval_such_a_call_is_made_once_approved(kept: str) -> None:
    harness.register_pydantic_ai(_hidden_gate(f"named-gate-{kept}"), requires_approval=["pay"])
    run_id = api.start_run(f"named-gate-{kept}", "pay")
    assert drive(run_id)[-1] is TaskResult.WAITING
    assert CALLS == []
    harness.approve(run_id, by="alice")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert CALLS == [("pay", 5)]
    assert api.get_run(run_id).result == "paid"


def _deferring(name: str) -> Agent[None, str]:
    external = ExternalToolset[None](
        [
            ToolDefinition(
                name="ask_human", parameters_json_schema={"type": "object"}, kind="external"
            )
        ],
        id="humans",
    )
    agent = Agent(
        FunctionModel(_script([("wire", {"amount": 3}), ("ask_human", {})])),
        name=name,
        toolsets=[external],
    )

    @agent.tool_plain
    def wire(amount: int) -> str:
        CALLS.append(("wire", amount))
        raise CallDeferred(metadata={"timeout": 600, "signal": "wired"})

    return agent


def test_deferred_calls_wait_as_the_harness_does_and_take_its_answers(kept: str) -> None:
    harness.register_pydantic_ai(_deferring(f"deferring-{kept}"))
    run_id = api.start_run(f"deferring-{kept}", "wire it")
    assert drive(run_id)[-1] is TaskResult.WAITING
    wired = api.get_steps(run_id)[1]
    assert wired.status is StepStatus.DEFERRED and wired.wait is not None
    assert wired.wait.signal == "wired" and wired.wait.timeout == 600
    assert CALLS == [("wire", 3)]
    api.signal(run_id, "wired", {"ref": "W-1"})
    assert drive(run_id)[-1] is TaskResult.WAITING  # now the external tool's call
    asked = api.get_steps(run_id)[3]
    assert asked.tool == "ask_human" and asked.status is StepStatus.DEFERRED
    api.complete_step(run_id, asked.index, error="nobody answered")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert CALLS == [("wire", 3)]  # never called again
    assert api.get_run(run_id).result == "{'ref': 'W-1'} | nobody answered"


def test_a_tool_offered_after_the_first_step_is_read_strictly() -> None:
    def later(ctx: RunContext[None]) -> FunctionToolset[None] | None:
        if ctx.run_step < 2:
            return None
        made = FunctionToolset[None]()

        @made.tool_plain
        def launch() -> str:
            CALLS.append(("launch", None))
            return "launched"

        return made

    agent = Agent(
        FunctionModel(_script([("x_shout", {"word": "a"}), ("launch", {})])),
        name="late-offer",
        toolsets=[FunctionToolset[None](id="none").prefixed("x"), DynamicToolset(later, id="late")],
    )

    @agent.tool_plain
    def x_shout(word: str) -> str:
        return word

    registered = harness.register_pydantic_ai(agent)
    assert registered.tool_effect("launch") is harness.ToolEffect.AT_MOST_ONCE
    run_id = api.start_run("late-offer", "go")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert CALLS == [("launch", None)]
    assert api.get_run(run_id).result == "a | launched"


class _Custom(FunctionToolset[None]):
    pass


def test_registration_refuses_a_toolset_whose_calls_cannot_be_steps() -> None:
    from pydantic_ai.toolsets import AbstractToolset

    class Homemade(AbstractToolset[None]):
        @property
        def id(self) -> str | None:
            return "homemade"

        async def get_tools(self, ctx: RunContext[None]) -> dict[str, Any]:
            return {}

        async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
            return None

    agent = Agent(FunctionModel(_script([])), name="homemade", toolsets=[Homemade().prefixed("h")])
    with pytest.raises(ValueError, match="has a Homemade: its calls cannot be harness steps"):
        harness.register_pydantic_ai(agent)
    nameless = Agent(FunctionModel(_script([])), name="nameless", toolsets=[FunctionToolset()])
    with pytest.raises(ValueError, match=r"has a FunctionToolset with no id: give it one"):
        harness.register_pydantic_ai(nameless)


def test_threads_carry_runs_of_an_agent_with_an_mcp_server_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The threads pool: two threads' steps call the agent's one MCP toolset
    at once. Pydantic AI shares one client per toolset, which belongs to one
    event loop: the agent's runs are driven on the process's MCP loop."""
    hold = tmp_path / "hold"
    hold.touch()  # the first call under each key waits while it exists
    monkeypatch.setenv("MCP_HOLD", str(hold))
    model = FunctionModel(_script([("held_note", {"text": "x"})]))
    harness.register_pydantic_ai(Agent(model, name="threaded", toolsets=[_ledger_server()]))
    run_ids = [api.start_run("threaded", f"go {i}") for i in range(2)]
    ended: dict[str, list[TaskResult]] = {}
    threads = [
        threading.Thread(target=lambda r=run_id: ended.__setitem__(r, drive(r)))
        for run_id in run_ids
    ]
    for thread in threads:
        thread.start()
    ledger = Path(os.environ["MCP_LEDGER"])
    deadline = time.monotonic() + 60
    while Ledger.read(ledger).executions.__len__() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(Ledger.read(ledger).executions) == 2  # both calls under way at once
    hold.unlink()
    for thread in threads:
        thread.join(60)
    assert {r: outcomes[-1] for r, outcomes in ended.items()} == {
        r: TaskResult.COMPLETED for r in run_ids
    }
    assert sorted(e.key for e in Ledger.read(ledger).executions) == sorted(
        f"{r}:1" for r in run_ids
    )
