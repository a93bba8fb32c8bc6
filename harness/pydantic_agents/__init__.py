"""Pydantic AI agents run one step per Celery task (the extra ``pydantic-ai``).

``harness.register_pydantic_ai(agent)`` registers a ``pydantic_ai.Agent`` as
a harness agent: each of its model requests and each of its function tool
calls is a harness step, with the checkpoints, idempotency keys, billing,
retries, budgets, approval, pause, cancel, reads, fork and replay of any
other step. How: harness.pydantic_agents.journal (the seam) and
harness.pydantic_agents.driver (the model and tools of such an agent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import UsageLimits

from harness.agents import Agent, register_agent
from harness.pydantic_agents import toolsets
from harness.pydantic_agents.driver import AgentModel, AgentToolSpec, Binding, step_context
from harness.tools import ToolEffect, ToolSpec
from harness.toolsets import Toolset

__all__ = ["register_pydantic_ai", "step_context"]


def register_pydantic_ai(
    agent: PydanticAgent[Any, Any],
    *,
    name: str | None = None,
    max_steps: int = 50,
    deps: Any = None,
    effects: Mapping[str, str] | None = None,
    requires_approval: Iterable[str] = (),
    steps_per_task: int = 1,
    usage_limits: UsageLimits | None = None,
) -> Agent:
    """Register ``agent`` under ``name`` (default: the agent's own ``name``)
    and return the harness agent that runs it.

    ``deps``: what the agent's tools get as ``ctx.deps`` (the same value on
    every worker: it is not stored). ``effects``: a tool's effect by name
    (``read_only``, ``idempotent``, ``at_most_once``); a function tool not
    named is ``idempotent``, as ``@harness.tool`` is, and an MCP server's
    tool is read from its annotations (harness.pydantic_agents.toolsets).
    ``requires_approval``: tools whose every call waits for an operator's
    ``harness approve``, besides those the agent declares
    ``requires_approval=True`` and those under ``approval_required()``. ``max_steps`` and
    ``steps_per_task`` are :class:`harness.Agent`'s. ``usage_limits``: the
    agent run's own (Pydantic AI's default allows 50 model requests).
    """
    if not isinstance(agent, PydanticAgent):
        raise TypeError(f"register_pydantic_ai takes a pydantic_ai.Agent, not {agent!r}")
    agent_name = name or agent.name
    if not agent_name:
        raise ValueError("the agent has no name: give it one, or pass name=")
    _refuse_compaction(agent)
    plain, others = toolsets.split(agent)
    tools = _function_tools(plain)
    effect_of = {tool: ToolEffect(effect) for tool, effect in (effects or {}).items()}
    approval = frozenset(requires_approval)
    if not others:  # every tool is known now: a name that is none of them is a mistake
        for option, named in (("effects", effect_of), ("requires_approval", approval)):
            unknown = sorted(set(named) - set(tools))
            if unknown:
                offered = ", ".join(sorted(tools)) or "no function tools"
                raise ValueError(f"{option} names {', '.join(unknown)}: the agent has {offered}")
    binding = Binding(agent, agent_name, deps, usage_limits, one_loop=bool(others))
    specs: list[ToolSpec | Toolset] = [
        AgentToolSpec(
            binding,
            tool_name,
            effect_of.get(tool_name, ToolEffect.IDEMPOTENT),
            description,
            tool_name in approval or needs_approval,
        )
        for tool_name, (description, needs_approval) in tools.items()
    ]
    late = None
    if others:
        listed = toolsets.AgentToolsets(binding, others, frozenset(tools), effect_of, approval)
        specs.append(listed)
        asks = any(toolsets.asks_approval(toolset) for toolset in others)
        late = toolsets.Late(binding, effect_of, approval, asks)
    return register_agent(
        toolsets.PydanticAgent(
            name=agent_name,
            model=AgentModel(binding),
            tools=specs,
            max_steps=max_steps,
            on_tool_error="fail",  # as in Pydantic AI: a tool's exception ends the run
            steps_per_task=steps_per_task,
            late=late,
        )
    )


def _function_tools(plain: list[FunctionToolset[Any]]) -> dict[str, tuple[str, bool]]:
    """The plain function tools: name -> (description, requires approval)."""
    tools: dict[str, tuple[str, bool]] = {}
    for toolset in plain:
        for tool_name, tool in toolset.tools.items():
            tools[tool_name] = (tool.description or "", bool(tool.requires_approval))
    return tools


def _refuse_compaction(agent: PydanticAgent[Any, Any]) -> None:
    """Message compaction (OpenAICompaction, AnthropicCompaction) is a paid
    model call that is not a step: each re-run would buy it again. Refused."""
    pending = [getattr(agent, "root_capability", None)]
    while pending:
        capability = pending.pop()
        if capability is None:
            continue
        if type(capability).__name__.endswith("Compaction"):
            raise ValueError(
                f"agent {agent.name!r} has {type(capability).__name__}: message compaction "
                "is not a harness step yet (each re-run of the agent would pay for it again)"
            )
        pending.extend(getattr(capability, "capabilities", None) or ())
