"""A Pydantic AI agent through pydantic-ai's own OpenAI and Anthropic models,
on the local wire-format server (tests/wire.py): two tools, an output type and
a validator that forces one retry. The run's output equals a plain
``run_sync`` of the same agent, and each turn is bought once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.models import Model
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

import harness
from harness import aio
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.store.memory import MemoryStore
from tests.rig import Rig
from tests.wire import WireServer

CALLS: list[str] = []


class Forecast(BaseModel):
    city: str
    high: int
    summary: str


def _turns() -> list[dict[str, Any]]:
    answer = {"city": "Oslo", "high": -3}
    return [
        {"tool_calls": [{"name": "find_city", "args": {"name": "oslo"}}]},
        {"tool_calls": [{"name": "forecast", "args": {"city": "Oslo"}}]},
        {"tool_calls": [{"name": "final_result", "args": {**answer, "summary": "short"}}]},
        {"tool_calls": [{"name": "final_result", "args": {**answer, "summary": "cold and clear"}}]},
    ]


def _model(provider: str, wire: WireServer, client: httpx.AsyncClient) -> Model:
    if provider == "openai":
        openai = OpenAIProvider(base_url=wire.openai_base_url, api_key="k", http_client=client)
        return OpenAIChatModel("gpt-test", provider=openai)
    anthropic = AnthropicProvider(base_url=wire.anthropic_base_url, api_key="k", http_client=client)
    return AnthropicModel("claude-test", provider=anthropic)


@pytest.fixture
def client() -> Iterator[httpx.AsyncClient]:
    """The providers' HTTP client, on this thread's loop (where the steps run
    too), closed after the test."""
    http = httpx.AsyncClient()
    yield http
    aio.run(http.aclose())


def weather(name: str, model: Model) -> Agent[None, Forecast]:
    agent = Agent(model, output_type=Forecast, name=name)

    @agent.tool_plain
    def find_city(name: str) -> str:
        CALLS.append("find_city")
        return name.title()

    @agent.tool_plain
    def forecast(city: str) -> dict[str, Any]:
        CALLS.append("forecast")
        return {"city": city, "high": -3}

    @agent.output_validator
    def long_enough(out: Forecast) -> Forecast:
        if len(out.summary) < 10:
            raise ModelRetry("the summary must be a sentence")
        return out

    return agent


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLS.clear()
    yield Rig(memory_store)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_provider_agent_runs_as_it_does_plainly_and_each_turn_is_bought_once(
    rig: Rig, wire: WireServer, client: httpx.AsyncClient, provider: str
) -> None:
    wire.script("plain run", _turns())
    wire.script("harness run", _turns())
    agent = weather(f"wire-{provider}", _model(provider, wire, client))
    plain = aio.run(agent.run("plain run")).output
    CALLS.clear()
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "harness run")
    assert rig.drive()[-1] is TaskResult.COMPLETED, rig.load(run_id).error
    steps = rig.store.steps(run_id)
    assert steps[-1].result is not None and steps[-1].result["final"] == plain.model_dump()
    assert CALLS == ["find_city", "forecast"]
    assert [wire.billed("harness run", t) for t in range(4)] == [1, 1, 1, 1]
    assert [s.kind.value for s in steps] == ["model", "tool", "model", "tool", "model", "model"]
    run = rig.load(run_id)
    assert run.input_tokens > 0 and run.output_tokens > 0  # each turn counted, once
