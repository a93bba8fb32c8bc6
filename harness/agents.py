"""Agents: a model plus tools, registered by name for workers to find."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harness.errors import AgentNotFound, ConfigError, UnknownTool
from harness.models import Model
from harness.tools import ToolSpec

_AGENTS: dict[str, Agent] = {}


@dataclass(frozen=True)
class Agent:
    """A named agent and its budget.

    ``on_tool_error``: ``"continue"`` hands a failed tool step's error to the
    next model turn, ``"fail"`` ends the run. ``max_attempts``: how many times
    one step may be interrupted (its worker killed) before the run fails, so a
    step that crashes every worker does not loop forever. ``deadline``:
    seconds from the run's creation after which it fails.
    """

    name: str
    model: Model
    tools: Sequence[ToolSpec] = ()
    max_steps: int = 50
    on_tool_error: str = "continue"
    max_attempts: int = 5
    deadline: float | None = None
    _by_name: dict[str, ToolSpec] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError("deadline must be a positive number of seconds")
        if self.on_tool_error not in ("continue", "fail"):
            raise ValueError("on_tool_error must be 'continue' or 'fail'")
        for spec in self.tools:
            if not isinstance(spec, ToolSpec):
                raise TypeError(f"{spec!r} is not a tool; decorate it with @harness.tool")
            if spec.name in self._by_name:
                raise ValueError(f"agent {self.name!r} has two tools named {spec.name!r}")
            self._by_name[spec.name] = spec

    def tool(self, name: str) -> ToolSpec:
        try:
            return self._by_name[name]
        except KeyError:
            offered = ", ".join(sorted(self._by_name)) or "no tools"
            raise UnknownTool(f"unknown tool {name!r}; agent {self.name!r} has {offered}") from None


def register_agent(agent: Agent) -> Agent:
    """Make ``agent`` available to workers by its name (last registration wins)."""
    _AGENTS[agent.name] = agent
    return agent


def get_agent(name: str) -> Agent:
    try:
        return _AGENTS[name]
    except KeyError:
        raise AgentNotFound(name, list(_AGENTS)) from None


def agent_names() -> list[str]:
    return sorted(_AGENTS)


def import_modules(modules: Iterable[str]) -> None:
    """Import the ``HARNESS_IMPORTS`` modules, which register agents and tools."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"HARNESS_IMPORTS: cannot import {module!r}: {err}") from err
