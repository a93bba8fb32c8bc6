"""Live runs of Pydantic AI agents (harness.pydantic_agents.live): how a kept
run ends, that a closed loop's runs are freed, and what registration refuses
because it would be re-run (and paid for) inline."""

from __future__ import annotations

import asyncio

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import harness
from harness import aio
from harness.engine.creation import create_run
from harness.pydantic_agents import live
from harness.store.memory import MemoryStore
from tests.rig import Rig


def _two_calls(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(
            parts=[ToolCallPart("a", {"x": 1}, "c1"), ToolCallPart("a", {"x": 2}, "c2")]
        )
    return ModelResponse(parts=[TextPart("ok")])


def _agent(name: str) -> Agent[None, str]:
    agent = Agent(FunctionModel(_two_calls), name=name)

    @agent.tool_plain
    async def a(x: int) -> int:
        return x

    return agent


def test_a_kept_run_told_to_stop_ends_cleanly(memory_store: MemoryStore) -> None:
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(_agent("stop-me")).name, "go")
    rig.drive(limit=2)  # the model step, and the first call: the run goes on to the second
    entry = live._LIVE[aio.loop()][run_id]
    entry.stop()  # parked or still on its way there

    async def settle() -> None:
        await asyncio.wait({entry.task})

    aio.run(settle())
    assert not entry.task.cancelled() and entry.task.exception() is None
    assert not entry.replay.finished


def test_a_closed_loops_kept_runs_are_freed(memory_store: MemoryStore) -> None:
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(_agent("freed")).name, "go")
    rig.drive(limit=1)  # parked at its first call
    loop = aio.loop()
    entry = live._LIVE[loop][run_id]
    aio.close()  # the thread's loop closed (the thread ended, the worker shut down, ...)
    assert loop not in live._LIVE
    assert entry.task.cancelled()


class OpenAICompaction(AbstractCapability[None]):
    """Stands for pydantic_ai's compaction capability (its module needs the provider's SDK)."""


def test_registration_refuses_message_compaction() -> None:
    agent = Agent(TestModel(), name="compacts", capabilities=[OpenAICompaction()])
    with pytest.raises(ValueError, match="OpenAICompaction: message compaction"):
        harness.register_pydantic_ai(agent)
