"""The provider conformance suite against the real services, when a key is set.

Skipped without ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` (this machine has
no network beyond package registries; the same behaviours are checked against
a local server of both wire formats in tests/unit/test_providers.py). The
model is ``HARNESS_TEST_OPENAI_MODEL`` / ``HARNESS_TEST_ANTHROPIC_MODEL``.
A real model is not scripted, so these check what any model must satisfy.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import harness
from harness.agents import register_agent
from harness.engine.creation import create_run
from harness.records import RunStatus, StepKind, StepStatus
from harness.store.sql import SQLStore
from tests.rig import Rig

LIVE = {
    "openai": ("OPENAI_API_KEY", "HARNESS_TEST_OPENAI_MODEL", "gpt-4.1-mini"),
    "anthropic": ("ANTHROPIC_API_KEY", "HARNESS_TEST_ANTHROPIC_MODEL", "claude-haiku-4-5"),
}


@harness.tool(effect="read_only")
def weather(city: str) -> dict[str, Any]:
    """The current temperature in Celsius in a city."""
    return {"city": city, "celsius": {"paris": 9, "oslo": -3}.get(city.lower(), 15)}


def live_model(provider: str) -> str:
    key, model_var, default = LIVE[provider]
    if not os.environ.get(key):
        pytest.skip(f"{key} is not set: the live conformance run needs a key")
    return os.environ.get(model_var) or default


def bot(provider: str, model: str, name: str = "live") -> None:
    register_agent(
        harness.Agent(
            name=name,
            model=f"{provider}:{model}",
            tools=[weather],
            max_steps=12,
            model_retries=3,
        )
    )


@pytest.mark.parametrize("provider", LIVE)
def test_a_live_run_with_tool_calls(provider: str, sqlite_store: SQLStore) -> None:
    bot(provider, live_model(provider))
    rig = Rig(sqlite_store)
    run_id = create_run(
        rig.runtime(),
        "live",
        "Use the weather tool for Paris and for Oslo, then say which is colder, in one sentence.",
    )
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    steps = sqlite_store.steps(run_id)
    tools = [s for s in steps if s.kind is StepKind.TOOL]
    assert tools and all(s.status is StepStatus.DONE for s in tools)
    models = [s.to_dict() for s in steps if s.kind is StepKind.MODEL]
    assert all(m["usage"]["input_tokens"] > 0 and m["usage"]["output_tokens"] > 0 for m in models)
    assert run.input_tokens == sum(m["usage"]["input_tokens"] for m in models)
    assert "oslo" in (run.result or "").lower()


@pytest.mark.parametrize("provider", LIVE)
def test_a_live_permanent_error_fails_the_run_with_the_providers_words(
    provider: str, sqlite_store: SQLStore
) -> None:
    live_model(provider)
    bot(provider, "no-such-model-for-harness-tests")
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "live", "hello")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.FAILED
    assert "HTTP 404" in (run.error or "") or "HTTP 400" in (run.error or "")
