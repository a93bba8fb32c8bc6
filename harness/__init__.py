"""Durable LLM agent runs on Celery.

import harness

@harness.tool(effect="idempotent")
def refund(order_id: str, ctx: harness.ToolContext) -> dict: ...

harness.register_agent(harness.Agent(name="support-bot", model=..., tools=[refund]))
run_id = harness.start_run("support-bot", goal="refund order 1234")
"""

from harness.agents import Agent, register_agent, register_pydantic_ai
from harness.api import (
    approve,
    cancel_run,
    complete_step,
    follow,
    fork_run,
    get_run,
    get_steps,
    pause_run,
    reject,
    replay_report,
    replay_run,
    resolve_run,
    resume_run,
    send_message,
    signal,
    start_run,
    stats,
)
from harness.errors import (
    AgentNotFound,
    BadForkPoint,
    ConfigError,
    DecisionConflict,
    HarnessError,
    InvalidToolArgs,
    ModelError,
    OperatorError,
    RetryableModelError,
    RunConflict,
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
from harness.tools import (
    Happened,
    NotHappened,
    ToolContext,
    ToolEffect,
    agent_tool,
    sleep_tool,
    tool,
)
from harness.toolsets.mcp import MCPServer
from harness.waiting import Deferred, Sleep

__all__ = [
    "Agent",
    "AgentNotFound",
    "AnthropicModel",
    "BadForkPoint",
    "ConfigError",
    "DecisionConflict",
    "Deferred",
    "Happened",
    "HarnessError",
    "InvalidToolArgs",
    "MCPServer",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelTurn",
    "NotHappened",
    "OpenAIModel",
    "OperatorError",
    "RetryableModelError",
    "Run",
    "RunConflict",
    "RunNotFound",
    "RunStatus",
    "ScriptedModel",
    "Settings",
    "Sleep",
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
    "agent_tool",
    "approve",
    "cancel_run",
    "complete_step",
    "follow",
    "fork_run",
    "get_run",
    "get_steps",
    "pause_run",
    "register_agent",
    "register_pydantic_ai",
    "reject",
    "replay_report",
    "replay_run",
    "resolve_run",
    "resume_run",
    "send_message",
    "signal",
    "sleep_tool",
    "start_run",
    "stats",
    "tool",
]
