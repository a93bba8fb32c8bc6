"""The toolsets of a Pydantic AI agent beside its plain function tools.

An agent's plain function tools (``@agent.tool``, a ``FunctionToolset``) are
known when it is registered. The tools of its other toolsets are known only
by asking them: an MCP server (``pydantic_ai.mcp.MCPToolset``), a dynamic
toolset (built from the run's context), an external toolset (calls made
elsewhere), and wrappers of any of them (prefixed, filtered, renamed,
prepared, approval required). Their calls are harness steps like any other:
Pydantic AI sends each through the durability seam (harness.pydantic_agents
.journal), and the model step lists them as the tool steps to take.

:class:`AgentToolsets` is a harness toolset (harness.toolsets): when a worker
first carries a run, it lists what these toolsets offer the model, by
running the agent once to its first model request with a model that stops
it there, and the listing is recorded with the run (harness.engine.offering):
each tool's effect (an MCP tool's annotations, as :class:`harness.MCPServer`
reads them; a tool that is not an MCP server's is ``idempotent``, as a
function tool is) and whether its calls wait for an operator (a tool the
agent marks ``requires_approval``, or any tool under an approval-required
wrapper: which calls its function lets through cannot be told ahead).

A tool a dynamic toolset offers only later in a run is not in the record:
:class:`PydanticAgent` gives it the strictest reading, ``at_most_once``
(MCP's default for a tool that says nothing), and approval if any of the
agent's toolsets asks for it. ``effects=`` and ``requires_approval=`` name
tools of any toolset, and decide over both.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent as Pydantic
from pydantic_ai import RunContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import (
    AbstractToolset,
    ApprovalRequiredToolset,
    CombinedToolset,
    DynamicToolset,
    ExternalToolset,
    FunctionToolset,
    WrapperToolset,
)

from harness.agents import Agent
from harness.errors import UnknownTool
from harness.records import JSON
from harness.tools import ToolEffect, ToolSpec, check_tool_name
from harness.toolsets import OfferedTool, ToolsetError, ToolsetUnavailable
from harness.toolsets.mcp import IDEMPOTENCY_META

#: The harness toolset's name, in a run's record of its offered tools.
NAME = "pydantic-ai"
#: The longest the listing may take (an MCP server's start-up included).
LIST_TIMEOUT = 60.0


def split(
    agent: Pydantic[Any, Any],
) -> tuple[list[FunctionToolset[Any]], list[AbstractToolset[Any]]]:
    """The agent's plain function toolsets, and its other toolsets (each
    checked: only those whose calls Pydantic AI makes durable, or defers)."""
    plain: list[FunctionToolset[Any]] = []
    others: list[AbstractToolset[Any]] = []
    for toolset in agent.toolsets:
        toolset.apply(lambda leaf: _check_id(agent, leaf))
        if isinstance(toolset, FunctionToolset):
            plain.append(toolset)
            continue
        toolset.apply(lambda leaf: _check_leaf(agent, leaf))
        toolset.apply(_adapt)
        toolset.apply(lambda leaf: _adapt_dynamic(agent, leaf))
        others.append(toolset)
    return plain, others


def _adapt_dynamic(agent: Pydantic[Any, Any], leaf: AbstractToolset[Any]) -> None:
    """A dynamic toolset's toolsets are made at run time: each is checked and
    fitted (:func:`_adapt`) as it is made, once its function returns it."""
    if not isinstance(leaf, DynamicToolset) or getattr(leaf, "_harness_keyed", False):
        return
    make = leaf.toolset_func

    async def made(ctx: RunContext[Any]) -> AbstractToolset[Any] | None:
        toolset = make(ctx)
        if inspect.isawaitable(toolset):
            toolset = await toolset
        if toolset is not None:
            toolset.apply(lambda each: _check_leaf(agent, each))
            toolset.apply(_adapt)
        return toolset

    leaf.toolset_func = made
    leaf._harness_keyed = True  # type: ignore[attr-defined]


def _adapt(leaf: AbstractToolset[Any]) -> None:
    """Fit an MCP server's toolset to a worker, once.

    Its calls carry their step's idempotency key in the request's ``_meta``
    (as :class:`harness.MCPServer`'s do), so the server can dedupe on it:
    the toolset's ``process_tool_call`` hook is wrapped (a hook of the
    agent's own still runs, and is given the keyed call). A stdio server
    with no log file of its own writes its stderr to the process's real
    one: a Celery worker's ``sys.stderr`` is a logging proxy with no file
    descriptor, which a child process cannot be given."""
    if not _is_mcp(leaf) or getattr(leaf, "_harness_keyed", False):
        return
    transport: Any = getattr(getattr(leaf, "client", None), "transport", None)
    if transport is not None and getattr(transport, "log_file", False) is None:
        transport.log_file = sys.__stderr__
    theirs = leaf.process_tool_call  # type: ignore[attr-defined]

    async def process(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        from harness.pydantic_agents.driver import step_context

        step = step_context()
        keyed = call_tool
        if step is not None:

            async def keyed(
                tool: str, arguments: dict[str, Any], *, metadata: dict[str, Any] | None = None
            ) -> Any:
                meta = {**(metadata or {}), IDEMPOTENCY_META: step.idempotency_key}
                return await call_tool(tool, arguments, metadata=meta)

        if theirs is not None:
            return await theirs(ctx, keyed, name, args)
        return await keyed(name, args)

    leaf.process_tool_call = process  # type: ignore[attr-defined]
    leaf._harness_keyed = True  # type: ignore[attr-defined]


def _check_leaf(agent: Pydantic[Any, Any], leaf: AbstractToolset[Any]) -> None:
    if isinstance(leaf, FunctionToolset | DynamicToolset | ExternalToolset) or _is_mcp(leaf):
        return
    raise ValueError(
        f"agent {agent.name!r} has a {type(leaf).__name__}: its calls cannot be harness steps "
        "(function, dynamic, external and MCP toolsets can, and wrappers of them)"
    )


def _check_id(agent: Pydantic[Any, Any], leaf: AbstractToolset[Any]) -> None:
    """Pydantic AI names a toolset's operations by its ``id``: one it was given
    (a run in flight must find it after a deploy), so one is needed."""
    if getattr(leaf, "_explicit_id", None) is None:
        raise ValueError(
            f"agent {agent.name!r} has a {type(leaf).__name__} with no id: give it one "
            f"({type(leaf).__name__}(..., id='...')); it names the toolset's calls in a run"
        )


def _is_mcp(toolset: AbstractToolset[Any]) -> bool:
    try:
        from pydantic_ai.mcp import MCPToolset
    except ImportError:  # pydantic-ai-slim without its mcp extra: there are none
        return False
    return isinstance(toolset, MCPToolset)


def asks_approval(toolset: AbstractToolset[Any]) -> bool:
    """Is there an approval-required wrapper anywhere in ``toolset``?"""
    if isinstance(toolset, ApprovalRequiredToolset):
        return True
    if isinstance(toolset, WrapperToolset):
        return asks_approval(toolset.wrapped)
    if isinstance(toolset, CombinedToolset):
        return any(asks_approval(each) for each in toolset.toolsets)
    return False


class _Listed(BaseException):
    """Stops the listing's run at its first model request (a BaseException:
    the agent's own code cannot swallow it)."""

    def __init__(self, info: AgentInfo) -> None:
        super().__init__()
        self.info = info


def _stop_at_request(messages: Any, info: AgentInfo) -> Any:
    raise _Listed(info)


@dataclass(eq=False)
class AgentToolsets:
    """A harness toolset: the tools of a Pydantic AI agent's toolsets other
    than its plain function tools (see the module docstring)."""

    binding: Any
    toolsets: Sequence[AbstractToolset[Any]]
    plain: frozenset[str]
    effects: dict[str, ToolEffect] = field(default_factory=dict)
    approval: frozenset[str] = frozenset()
    name: str = NAME

    def list_offered(self) -> list[OfferedTool]:
        from harness.toolsets import sessions  # the loop the agent's runs use

        try:
            return sessions.run(self._list, LIST_TIMEOUT)
        except (ToolsetError, ToolsetUnavailable):
            raise
        except Exception as err:
            what = f"agent {self.binding.name!r}: listing its toolsets' tools: {_said(err)}"
            if unreachable(err):  # a server down: the run waits for it
                raise ToolsetUnavailable(what) from err
            raise ToolsetError(what) from err  # the agent's own code: no wait would help

    async def _list(self) -> list[OfferedTool]:
        offered: list[OfferedTool] = []
        for toolset in self.toolsets:
            ask = asks_approval(toolset)
            for tool in await self._tools_of(toolset):
                if tool.name in self.plain:
                    continue
                offered.append(
                    OfferedTool(
                        tool.name,
                        tool.name,
                        tool.description or "",
                        tool.parameters_json_schema,
                        self.effects.get(tool.name) or _effect(tool.metadata),
                        ask or tool.kind == "unapproved" or tool.name in self.approval,
                    )
                )
        return offered

    async def _tools_of(self, toolset: AbstractToolset[Any]) -> list[Any]:
        """What ``toolset`` (with the plain function tools) offers at a run's
        first model request: the agent is run to there, and stopped."""
        agent = self.binding.agent
        with agent.override(toolsets=[toolset]):
            try:
                await agent.run("", model=FunctionModel(_stop_at_request), deps=self.binding.deps)
            except _Listed as listed:
                return list(listed.info.function_tools)
        raise ToolsetError(f"agent {self.binding.name!r} ended before its first model request")

    def bind(self, offered: Sequence[OfferedTool]) -> list[ToolSpec]:
        from harness.pydantic_agents.driver import AgentToolSpec

        return [
            AgentToolSpec(self.binding, t.name, t.effect, t.description, t.requires_approval)
            for t in offered
        ]

    def describe(self) -> dict[str, JSON]:
        return {"pydantic_ai": [_describe(toolset) for toolset in self.toolsets]}


def unreachable(err: BaseException) -> bool:
    """Is ``err`` a server that could not be started or reached (worth
    waiting for), rather than a fault of the agent's own code?"""
    try:
        from mcp.shared.exceptions import MCPError
    except ImportError:  # no MCP SDK: no MCP server either
        mcp_errors: tuple[type[BaseException], ...] = ()
    else:
        mcp_errors = (MCPError,)
    if isinstance(err, BaseExceptionGroup):  # anyio's task groups gather them
        return any(unreachable(each) for each in err.exceptions)
    if isinstance(err, (OSError, TimeoutError, *mcp_errors)):
        return True
    # fastmcp's own word for a server it could not start or connect to
    return isinstance(err, RuntimeError) and str(err).startswith("Client failed to connect")


def _said(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _describe(toolset: AbstractToolset[Any]) -> str:
    return f"{type(toolset).__name__}:{toolset.id or ''}"


def _effect(metadata: dict[str, Any] | None) -> ToolEffect:
    """An MCP tool's effect from its annotations (MCP's defaults: a tool that
    says nothing may destroy and is not idempotent); any other tool's is
    ``idempotent``, as a function tool's."""
    if not metadata or "annotations" not in metadata:
        return ToolEffect.IDEMPOTENT
    hints = metadata.get("annotations") or {}
    if hints.get("readOnlyHint"):
        return ToolEffect.READ_ONLY
    if hints.get("idempotentHint"):
        return ToolEffect.IDEMPOTENT
    return ToolEffect.AT_MOST_ONCE


@dataclass(frozen=True)
class Late:
    """How a tool that is in no record is read (a dynamic toolset's, offered
    after the run's first step): ``at_most_once`` unless ``effects`` says,
    approval if ``approval`` names it or ``any_approval``."""

    binding: Any
    effects: dict[str, ToolEffect]
    approval: frozenset[str]
    any_approval: bool

    def spec(self, name: str) -> ToolSpec:
        from harness.pydantic_agents.driver import AgentToolSpec

        check_tool_name(name)
        effect = self.effects.get(name, ToolEffect.AT_MOST_ONCE)
        return AgentToolSpec(self.binding, name, effect, "", self.needs_approval(name))

    def needs_approval(self, name: str) -> bool:
        return self.any_approval or name in self.approval


@dataclass(frozen=True)
class PydanticAgent(Agent):
    """The harness agent of a Pydantic AI agent with toolsets: a tool not
    among its function tools nor in its run's record is read by ``late``."""

    late: Late | None = None

    def tool(self, name: str) -> ToolSpec:
        try:
            return super().tool(name)
        except UnknownTool:
            if self.late is None or not name:
                raise
            try:
                return self.late.spec(name)
            except ValueError as err:
                raise UnknownTool(f"unknown tool {name!r}: {err}") from None

    def needs_approval(self, name: str | None) -> bool:
        if name and name not in self._by_name and self.late is not None:
            return self.late.needs_approval(name)
        return super().needs_approval(name)

    def tool_effect(self, name: str | None) -> ToolEffect | None:
        if name and name not in self._by_name and self.late is not None:
            return self.late.effects.get(name, ToolEffect.AT_MOST_ONCE)
        return super().tool_effect(name)
