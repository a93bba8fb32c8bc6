"""Agents: a model plus tools, registered by name for workers to find."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from harness.errors import AgentNotFound, ConfigError, UnknownTool
from harness.models import AsyncModel, Model
from harness.output import FINAL_TOOL, check_output_type
from harness.tools import ToolEffect, ToolSpec
from harness.toolsets import Toolset

_AGENTS: dict[str, Agent] = {}


@dataclass(frozen=True)
class Agent:
    """A named agent and its budget.

    ``on_tool_error``: ``"continue"`` hands a failed tool step's error to the
    next model turn, ``"fail"`` ends the run. ``max_attempts``: how many times
    one step may be interrupted (its worker killed) before the run fails, so a
    step that crashes every worker does not loop forever. ``deadline``:
    seconds from the run's creation after which it fails.
    ``running_checkpoint``: ``"effects"`` (the default) writes the "about to
    execute" checkpoint only before a tool that acts on the world; a model
    step or a ``read_only`` tool, safe to run twice, skips it on its normal
    path. ``"always"`` writes it before every step (see harness.engine.runner).
    ``steps_per_task``: throughput mode, off at 1. Above 1, one step task
    goes on to execute up to this many consecutive steps that are safe to
    rerun (model steps, ``read_only`` and ``idempotent`` tools), each with its
    own checkpoints, before sending the next message; an ``at_most_once``
    tool always gets a task of its own. Fewer broker hops, less spreading
    of one run's steps across workers.
    ``model``: a :class:`~harness.models.Model` (its ``next_turn`` may be
    ``async def``: :class:`~harness.models.AsyncModel`), or a provider
    shorthand, ``"openai:gpt-4.1-mini"`` or ``"anthropic:claude-sonnet-4-5"``.
    ``model_retries``: how many times a transient provider failure (429, 5xx,
    529, a timeout, a dropped connection) is retried, each after a durable
    back-off, before the run fails with it.
    ``max_tokens`` and ``max_cost_usd``: the run's budgets (input plus output
    tokens; US dollars, from HARNESS_PRICES). Before each model call its
    tokens are reserved (the request's estimate plus its output limit), so a
    run stops before the call that would exceed a budget; ``on_budget``:
    ``"fail"`` ends it, ``"pause"`` holds it for ``harness resume`` with a
    raised budget.
    ``output_type``: a pydantic model class; the final answer is then asked
    for with the provider's structured output and must validate against it,
    and the run's result is that JSON object (harness.output). An answer that
    does not validate goes back to the model with the validation error, at
    most ``output_retries`` times, before the run fails with that error.
    ``tools`` may hold toolsets beside function tools: a
    :class:`harness.MCPServer` offers every tool its server lists (read when
    a worker first carries a run, and recorded with it: harness.toolsets).
    ``tool_retries``: how many times a call whose server cannot be started
    or reached is retried, each after a durable back-off, before the step
    fails with the server's own message.
    """

    name: str
    model: Model | AsyncModel | str
    tools: Sequence[ToolSpec | Toolset] = ()
    max_steps: int = 50
    on_tool_error: str = "continue"
    max_attempts: int = 5
    deadline: float | None = None
    running_checkpoint: str = "effects"
    steps_per_task: int = 1
    model_retries: int = 8
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    on_budget: str = "fail"
    output_type: type[BaseModel] | None = None
    output_retries: int = 2
    tool_retries: int = 5
    #: The toolsets among ``tools`` (MCP servers): their tools are bound per run.
    toolsets: tuple[Toolset, ...] = field(default=(), init=False)
    _by_name: dict[str, ToolSpec] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.model, str):
            from harness.providers import model_from_name

            object.__setattr__(self, "model", model_from_name(self.model))
        if self.model_retries < 0:
            raise ValueError("model_retries must be 0 or more")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.max_cost_usd is not None and not self.max_cost_usd > 0:
            raise ValueError("max_cost_usd must be a positive number of US dollars")
        if self.on_budget not in ("fail", "pause"):
            raise ValueError("on_budget must be 'fail' or 'pause'")
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError("deadline must be a positive number of seconds")
        if self.on_tool_error not in ("continue", "fail"):
            raise ValueError("on_tool_error must be 'continue' or 'fail'")
        if self.steps_per_task < 1:
            raise ValueError("steps_per_task must be at least 1")
        if self.running_checkpoint not in ("effects", "always"):
            raise ValueError("running_checkpoint must be 'effects' or 'always'")
        if self.output_type is not None:
            check_output_type(self.output_type)
        if self.output_retries < 0:
            raise ValueError("output_retries must be 0 or more")
        if self.tool_retries < 0:
            raise ValueError("tool_retries must be 0 or more")
        self._split_toolsets()
        for spec in self.tools:
            if not isinstance(spec, ToolSpec):
                if isinstance(spec, Toolset):
                    continue
                raise TypeError(f"{spec!r} is not a tool; decorate it with @harness.tool")
            if self.output_type is not None and spec.name == FINAL_TOOL:
                raise ValueError(
                    f"agent {self.name!r} has a tool named {FINAL_TOOL!r}, the name its "
                    "structured answer is asked for with (output_type): rename the tool"
                )
            if spec.name in self._by_name:
                raise ValueError(f"agent {self.name!r} has two tools named {spec.name!r}")
            self._by_name[spec.name] = spec

    def _split_toolsets(self) -> None:
        """Note the toolsets among ``tools`` in ``toolsets`` (their tools are
        known per run: harness.engine.offering.for_run), each name once."""
        toolsets = tuple(t for t in self.tools if isinstance(t, Toolset))
        if not toolsets:
            return
        names = [t.name for t in toolsets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"agent {self.name!r} has two servers named {twice[0]!r}")
        object.__setattr__(self, "toolsets", toolsets)

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools to offer and call: the function tools (and, in an agent
        bound to a run, its toolsets' tools: harness.engine.offering.bind)."""
        return tuple(self._by_name.values())

    def tool(self, name: str) -> ToolSpec:
        try:
            return self._by_name[name]
        except KeyError:
            offered = ", ".join(sorted(self._by_name)) or "no tools"
            raise UnknownTool(f"unknown tool {name!r}; agent {self.name!r} has {offered}") from None

    def needs_approval(self, name: str | None) -> bool:
        """Does a call of the named tool wait for an operator's word?"""
        spec = self._by_name.get(name or "")
        return spec is not None and spec.requires_approval

    def tool_effect(self, name: str | None) -> ToolEffect | None:
        """The effect of the named tool; None for a tool the agent does not have."""
        spec = self._by_name.get(name or "")
        return None if spec is None else spec.effect


def register_agent(agent: Agent) -> Agent:
    """Make ``agent`` available to workers by its name (last registration wins)."""
    _AGENTS[agent.name] = agent
    return agent


def register_pydantic_ai(
    agent: Any,
    *,
    name: str | None = None,
    max_steps: int = 50,
    deps: Any = None,
    effects: Mapping[str, str] | None = None,
    requires_approval: Iterable[str] = (),
    steps_per_task: int = 1,
    usage_limits: Any = None,
) -> Agent:
    """Register a ``pydantic_ai.Agent`` to run one step per Celery task (the
    extra ``pydantic-ai``); see harness.pydantic_agents.register_pydantic_ai.
    Pydantic AI is imported here, on first use, not by ``import harness``."""
    try:
        from harness.pydantic_agents import register_pydantic_ai as register
    except ImportError as err:
        raise ConfigError(
            f"register_pydantic_ai needs the 'pydantic-ai' extra: pip install -e "
            f"'.[pydantic-ai]' in the harness's clone ({err})"
        ) from err

    return register(
        agent,
        name=name,
        max_steps=max_steps,
        deps=deps,
        effects=effects,
        requires_approval=requires_approval,
        steps_per_task=steps_per_task,
        usage_limits=usage_limits,
    )


def registered_agents() -> list[Agent]:
    """Every agent registered in this process (what a worker publishes)."""
    return list(_AGENTS.values())


def get_agent(name: str) -> Agent:
    try:
        return _AGENTS[name]
    except KeyError:
        raise AgentNotFound(name, list(_AGENTS)) from None


def import_modules(modules: Iterable[str]) -> None:
    """Import the ``HARNESS_IMPORTS`` modules, which register agents and tools.

    Resolved as ``celery -A`` resolves its ``imports``: with the working
    directory first on the import path, so the ``harness`` command finds the
    ``myagents.py`` next to it that a worker started there finds too. A module
    that cannot be found, or whose code raises, is a :class:`ConfigError`
    naming it (the exception chained).
    """
    with _cwd_in_path():
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise ConfigError(f"HARNESS_IMPORTS: cannot import {module!r}: {err}") from err
            except Exception as err:  # the module's own code failed: name it, and how to see it
                raise ConfigError(
                    f"HARNESS_IMPORTS: importing {module!r} raised {type(err).__name__}: {err} "
                    f"(`python -c 'import {module}'` shows the traceback)"
                ) from err


@contextmanager
def _cwd_in_path() -> Iterator[None]:
    """The working directory at the front of ``sys.path`` for the duration, as
    celery.utils.imports.cwd_in_path does (an entry point script's path starts
    with the script's folder, not the working directory)."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:  # the working directory was deleted
        cwd = ""
    if not cwd or cwd in sys.path:
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)
