"""Durable LLM agent runs on Celery.

import harness

@harness.tool(effect="idempotent")
def refund(order_id: str, ctx: harness.ToolContext) -> dict: ...

harness.register_agent(harness.Agent(name="support-bot", model=..., tools=[refund]))
run_id = harness.start_run("support-bot", goal="refund order 1234")
"""

from harness.agents import Agent, register_agent
from harness.api import cancel_run, get_run, get_steps, resolve_run, start_run, stats
from harness.errors import (
    AgentNotFound,
    ConfigError,
    HarnessError,
    InvalidToolArgs,
    ModelError,
    RetryableModelError,
    RunNotFound,
    StaleWriteError,
    StepInterrupted,
    StoreError,
    Throttled,
    ToolError,
    UnknownTool,
)
from harness.models import Model, ModelRequest, ModelTurn, ScriptedModel, ToolCall, Usage
from harness.providers import AnthropicModel, OpenAIModel
from harness.records import Run, RunStatus, Step, StepKind, StepStatus
from harness.settings import Settings
from harness.tools import Happened, NotHappened, ToolContext, ToolEffect, tool

__all__ = [
    "Agent",
    "AgentNotFound",
    "AnthropicModel",
    "ConfigError",
    "Happened",
    "HarnessError",
    "InvalidToolArgs",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelTurn",
    "NotHappened",
    "OpenAIModel",
    "RetryableModelError",
    "Run",
    "RunNotFound",
    "RunStatus",
    "ScriptedModel",
    "Settings",
    "StaleWriteError",
    "Step",
    "StepInterrupted",
    "StepKind",
    "StepStatus",
    "StoreError",
    "Throttled",
    "ToolCall",
    "ToolContext",
    "ToolEffect",
    "ToolError",
    "UnknownTool",
    "Usage",
    "cancel_run",
    "get_run",
    "get_steps",
    "register_agent",
    "resolve_run",
    "start_run",
    "stats",
    "tool",
]
