"""Toolsets in the engine, with a toolset of our own in this process (no
server): the tools a run is offered are read when it is first carried and
recorded with it; a change of the listing later does not change the run; a
replay is served from its recording's tools without listing; a server that
cannot be reached is retried, then fails; a call that may have reached it
before the connection broke is in doubt if it is at_most_once. And what
MCPServer makes of its arguments and of a tool's annotations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mcp_types
import pytest

import harness
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.errors import ToolUnavailable
from harness.models import ModelRequest, ModelTurn
from harness.records import JSON, RunStatus, StepStatus
from harness.replay.rerun import replay_run
from harness.store.memory import MemoryStore
from harness.tools import ToolEffect, ToolSpec
from harness.toolsets import OfferedTool, ToolsetError, ToolsetUnavailable
from harness.toolsets.mcp import MCPServer, effect_of
from tests.rig import Rig


@dataclass
class FakeToolset:
    """A toolset whose listing and calls a test sets: ``failures`` are raised
    by the next calls, one each, before they answer."""

    name: str
    offered: list[OfferedTool]
    failures: list[Exception] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    listings: int = 0
    unreachable: bool = False

    def list_offered(self) -> list[OfferedTool]:
        self.listings += 1
        if self.unreachable:
            raise ToolsetUnavailable(f"server {self.name!r} could not be started: no token")
        return list(self.offered)

    def bind(self, offered: Sequence[OfferedTool]) -> list[ToolSpec]:
        return [self._spec(tool) for tool in offered]

    def describe(self) -> dict[str, JSON]:
        return {"fake": self.name}

    def _spec(self, tool: OfferedTool) -> ToolSpec:
        def call() -> str:
            self.calls.append(tool.name)
            if self.failures:
                raise self.failures.pop(0)
            return f"{tool.remote} done"

        return harness.tool(
            effect=tool.effect, name=tool.name, requires_approval=tool.requires_approval
        )(call)


def offered(name: str, effect: ToolEffect = ToolEffect.IDEMPOTENT) -> OfferedTool:
    return OfferedTool(name, name, f"{name} it", {"type": "object", "properties": {}}, effect)


class Recorder(harness.ScriptedModel):
    """A scripted model that notes the tools each turn was offered."""

    def __init__(self, turns: list[dict[str, object]]) -> None:
        super().__init__(turns)
        self.offered: list[list[str]] = []

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        self.offered.append([t.name for t in request.tools])
        return super().next_turn(request)


def calling(*names: str) -> list[dict[str, object]]:
    return [{"tool_calls": [{"name": n, "args": {}} for n in names]}, {"final": "done"}]


def run(rig: Rig, agent: harness.Agent) -> str:
    """Carry a run of ``agent`` as far as it goes. Its id is the agent's name:
    unique, for the records of the tools offered are cached by run (and
    every rig's clock starts at the same time)."""
    harness.register_agent(agent)
    create_run(rig.runtime(), agent.name, "go", run_id=agent.name)
    rig.drive()
    return agent.name


@pytest.fixture
def rig() -> Rig:
    return Rig(MemoryStore())


def test_the_run_keeps_the_tools_it_was_offered_when_it_started(rig: Rig) -> None:
    toolset = FakeToolset("srv", [offered("a"), offered("b")])
    model = Recorder(
        [*calling("a")[:1], {"tool_calls": [{"name": "b", "args": {}}]}, {"final": "ok"}]
    )
    agent = harness.Agent("ts-keep", model, tools=[toolset])
    harness.register_agent(agent)
    create_run(rig.runtime(), "ts-keep", "go", run_id="ts-keep")
    rig.drive(limit=2)  # the first turn, and its call of a
    toolset.offered = [offered("c")]  # the server changed meanwhile
    rig.drive()
    assert rig.load("ts-keep").status is RunStatus.COMPLETED
    assert model.offered == [["a", "b"]] * 3
    assert toolset.calls == ["a", "b"] and toolset.listings == 1
    record = rig.store.offered_tools("ts-keep")
    assert isinstance(record, dict)
    assert [t["name"] for t in record["srv"]] == ["a", "b"]  # type: ignore[index, union-attr]


def test_a_tool_the_server_options_say_needs_a_person_waits_for_approval(rig: Rig) -> None:
    """Approval is read from the run's record, in the operator's process too."""
    from harness.engine import operations

    gated = OfferedTool("pay", "pay", "", {"type": "object"}, ToolEffect.AT_MOST_ONCE, True)
    toolset = FakeToolset("srv", [gated])
    run_id = run(
        rig, harness.Agent("ts-gate", harness.ScriptedModel(calling("pay")), tools=[toolset])
    )
    assert rig.load(run_id).status is RunStatus.WAITING and toolset.calls == []
    assert rig.store.steps(run_id)[1].status is StepStatus.AWAITING_APPROVAL
    operations.decide(rig.runtime(), run_id, approve=True, who="op", step_index=1)
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED and toolset.calls == ["pay"]


def test_a_replay_is_served_from_its_recording_without_listing(rig: Rig) -> None:
    toolset = FakeToolset("srv", [offered("a")])
    recorded = run(
        rig, harness.Agent("ts-rec", harness.ScriptedModel(calling("a")), tools=[toolset])
    )
    toolset.unreachable = True  # the server is gone: the replay needs none
    replay_id = replay_run(rig.runtime(), recorded, "ts-rec")
    rig.drive()
    replayed = rig.load(replay_id)
    assert replayed.status is RunStatus.COMPLETED, replayed
    assert toolset.calls == ["a"] and toolset.listings == 1


def test_a_server_that_cannot_list_leaves_the_run_to_be_sent_again(rig: Rig) -> None:
    toolset = FakeToolset("srv", [offered("a")], unreachable=True)
    agent = harness.Agent("ts-down", harness.ScriptedModel(calling("a")), tools=[toolset])
    harness.register_agent(agent)
    create_run(rig.runtime(), "ts-down", "go", run_id="ts-down")
    assert rig.drive() == [TaskResult.NO_AGENT]
    assert rig.store.offered_tools("ts-down") is None
    toolset.unreachable = False
    rig.sent.append(("ts-down", 0))  # the sweeper's re-send
    rig.drive()
    assert rig.load("ts-down").status is RunStatus.COMPLETED


def test_a_clash_with_a_function_tool_is_refused_when_the_list_is_read(rig: Rig) -> None:
    @harness.tool
    def a() -> str:
        return "mine"

    toolset = FakeToolset("srv", [offered("a")])
    agent = harness.Agent("ts-clash", harness.ScriptedModel(calling("a")), tools=[a, toolset])
    run_id = run(rig, agent)
    assert rig.store.offered_tools(run_id) is None and rig.load(run_id).step_count == 1
    failed = rig.load(run_id)
    assert failed.status is RunStatus.FAILED
    assert "the name of a function tool: give the server a prefix" in (failed.error or "")


def test_a_function_tool_deployed_under_a_recorded_name_fails_the_run(rig: Rig) -> None:
    """The run recorded the server's `b`; a deploy adds a function tool `b`:
    no worker of that deploy can carry the run, and waiting will not help,
    so it fails, saying why (a server merely down leaves it waiting)."""
    toolset = FakeToolset("srv", [offered("a"), offered("b")])
    turns = [*calling("a")[:1], *calling("b")]
    harness.register_agent(harness.Agent("ts-late", harness.ScriptedModel(turns), tools=[toolset]))
    create_run(rig.runtime(), "ts-late", "go", run_id="ts-late")
    rig.drive(limit=2)  # the first turn and its call of a: the record is written

    @harness.tool
    def b() -> str:
        return "mine"

    agent = harness.Agent("ts-late", harness.ScriptedModel(turns), tools=[b, toolset])
    harness.register_agent(agent)
    assert rig.drive() == [TaskResult.FAILED]
    failed = rig.load("ts-late")
    assert failed.status is RunStatus.FAILED and toolset.calls == ["a"]
    assert "has two tools named 'b'" in (failed.error or "")


@pytest.mark.parametrize(
    ("effect", "sent", "status", "calls"),
    [
        (ToolEffect.IDEMPOTENT, True, StepStatus.DONE, 3),  # retried, twice
        (ToolEffect.AT_MOST_ONCE, False, StepStatus.DONE, 3),  # never sent: retried
        (ToolEffect.AT_MOST_ONCE, True, StepStatus.IN_DOUBT, 1),  # may have happened
    ],
)
def test_an_unreachable_server_is_retried_per_the_tools_effect(
    rig: Rig, effect: ToolEffect, sent: bool, status: StepStatus, calls: int
) -> None:
    broke = ToolUnavailable("MCP server 'srv': connection refused", sent=sent)
    toolset = FakeToolset("srv", [offered("a", effect)], failures=[broke, broke])
    name = f"ts-{effect.value}-{sent}"
    run_id = run(rig, harness.Agent(name, harness.ScriptedModel(calling("a")), tools=[toolset]))
    step = rig.store.steps(run_id)[1]
    assert step.status is status and len(toolset.calls) == calls
    if status is StepStatus.DONE:
        assert step.retries == 2 and rig.load(run_id).status is RunStatus.COMPLETED
    else:
        assert "it may have" not in (step.error or "") and "harness resolve" in (step.error or "")


def test_a_server_unreachable_past_its_retries_fails_the_step_with_its_message(rig: Rig) -> None:
    broke = ToolUnavailable("MCP server 'srv' could not be started; it said: no token", sent=False)
    toolset = FakeToolset("srv", [offered("a")], failures=[broke] * 3)
    agent = harness.Agent(
        "ts-gone", harness.ScriptedModel(calling("a")), tools=[toolset], tool_retries=2
    )
    run_id = run(rig, agent)
    step = rig.store.steps(run_id)[1]
    assert step.status is StepStatus.FAILED
    assert step.error == "tool step 1 failed after 2 retries: " + str(broke)
    assert rig.load(run_id).status is RunStatus.COMPLETED  # the model was told, and answered


# -- MCPServer's own rules -------------------------------------------------------------


def test_effects_come_from_the_annotations_as_mcp_defines_them() -> None:
    hints = mcp_types.ToolAnnotations
    assert effect_of(None) is ToolEffect.AT_MOST_ONCE
    assert effect_of(hints()) is ToolEffect.AT_MOST_ONCE
    assert effect_of(hints(read_only_hint=True, idempotent_hint=False)) is ToolEffect.READ_ONLY
    assert effect_of(hints(idempotent_hint=True)) is ToolEffect.IDEMPOTENT
    assert effect_of(hints(destructive_hint=False)) is ToolEffect.AT_MOST_ONCE


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "either command"),
        ({"command": "x", "url": "http://h/mcp"}, "either command"),
        ({"url": "ftp://h/mcp"}, "must be http"),
        ({"command": "x", "headers": {"a": "b"}}, "headers are for a url"),
        ({"command": "x", "args": "--flag"}, "args must be a sequence"),
        ({"command": "x", "env": {"A": 1}}, "env must map strings"),
        ({"command": "x", "prefix": "my tools"}, "1 to 64 letters"),
        ({"command": "x", "effects": {"t": "sometimes"}}, "effect of 't' must be one of"),
    ],
)
def test_what_an_mcp_server_is_given_is_checked(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MCPServer("s", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("recorded", "named", "effect"),
    [
        (ToolEffect.IDEMPOTENT, None, ToolEffect.IDEMPOTENT),  # not named: as recorded
        (ToolEffect.IDEMPOTENT, "at_most_once", ToolEffect.AT_MOST_ONCE),  # stricter: wins
        (ToolEffect.READ_ONLY, "idempotent", ToolEffect.IDEMPOTENT),
        (ToolEffect.AT_MOST_ONCE, "read_only", ToolEffect.AT_MOST_ONCE),  # looser: recorded
        (ToolEffect.AT_MOST_ONCE, "idempotent", ToolEffect.AT_MOST_ONCE),
    ],
)
def test_a_recorded_tool_is_bound_under_the_stricter_of_its_record_and_the_options(
    recorded: ToolEffect, named: str | None, effect: ToolEffect
) -> None:
    """A deploy that tightens a server's options holds for runs in flight;
    one that loosens them does not loosen what a run recorded."""
    effects = {} if named is None else {"send": named}
    server = MCPServer("s", command="srv", effects=effects, requires_approval=["send"])
    (bound,) = server.bind([offered("send", recorded)])
    assert bound.effect is effect and bound.requires_approval is True
    gated = OfferedTool("send", "send", "", {"type": "object"}, recorded, requires_approval=True)
    (kept,) = MCPServer("s", command="srv").bind([gated])  # an option dropped since
    assert kept.requires_approval is True and kept.effect is recorded


def test_an_agent_takes_a_server_beside_function_tools_and_each_name_once() -> None:
    server = MCPServer("s", command="srv")
    agent = harness.Agent("ts-agent", harness.ScriptedModel([]), tools=[server])
    assert agent.toolsets == (server,) and agent.tool_specs == ()
    with pytest.raises(ValueError, match="two servers named 's'"):
        harness.Agent(
            "ts-twice", harness.ScriptedModel([]), tools=[server, MCPServer("s", url="http://h/")]
        )
    assert "srv" in repr(server) and server.describe()["env"] == []


def test_a_listing_check_names_what_is_wrong() -> None:
    from harness.engine.offering import MAX_TOOLS, check_offered

    agent = harness.Agent("ts-many", harness.ScriptedModel([]), tools=[FakeToolset("srv", [])])
    many = [offered(f"t{i}") for i in range(MAX_TOOLS + 1)]
    with pytest.raises(ToolsetError, match=f"would offer {MAX_TOOLS + 1} tools"):
        check_offered(agent, {"srv": many})
    with pytest.raises(ToolsetError, match="the name of a tool of server 'srv'"):
        check_offered(agent, {"srv": [offered("a")], "other": [offered("a")]})


def test_the_catalog_hashes_a_servers_definition_not_its_secrets() -> None:
    from harness.catalog import definition, definition_hash

    def agent(**options: object) -> harness.Agent:
        server = MCPServer("s", command="srv", **options)  # type: ignore[arg-type]
        return harness.Agent("ts-cat", harness.ScriptedModel([]), tools=[server])

    described = definition(agent(env={"TOKEN": "secret"}))
    assert described["toolsets"] == [agent(env={"TOKEN": "other"}).toolsets[0].describe()]
    assert "secret" not in str(described)
    assert definition_hash(agent(prefix="a")) != definition_hash(agent(prefix="b"))
    plain = harness.Agent("ts-cat", harness.ScriptedModel([]))
    assert "toolsets" not in definition(plain)


def test_a_tool_named_as_the_structured_answer_is_refused() -> None:
    from pydantic import BaseModel

    from harness.engine.offering import check_offered
    from harness.output import FINAL_TOOL

    class Answer(BaseModel):
        text: str

    toolset = FakeToolset("srv", [])
    agent = harness.Agent("ts-out", harness.ScriptedModel([]), tools=[toolset], output_type=Answer)
    with pytest.raises(ToolsetError, match="structured answer"):
        check_offered(agent, {"srv": [offered(FINAL_TOOL)]})


def test_without_the_mcp_extra_a_server_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from harness.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"needs the 'mcp' extra: pip install -e '\.\[mcp\]'"):
        MCPServer("s", command="srv")
