"""Agents whose model is a real provider SDK, for the tests that run a local
server of the providers' wire formats (the ``wire`` fixture, tests.wire).

Apart from tests.agents because importing the two SDKs takes a worker about a
second: a cluster imports this module only when the ``wire`` fixture is in use
(tests.cluster).
"""

from __future__ import annotations

import pydantic

import harness
from tests.agents import effect, lookup

# Real providers, reached at OPENAI_BASE_URL / ANTHROPIC_BASE_URL: the tests
# point both at a local server that speaks their wire formats (tests.wire).
for bot, provider_model in (
    ("openai-bot", harness.OpenAIModel("gpt-test", timeout=5)),
    ("anthropic-bot", harness.AnthropicModel("claude-test", timeout=5)),
):
    harness.register_agent(
        harness.Agent(name=bot, model=provider_model, tools=[effect, lookup], max_steps=100)
    )


# A provider model on a token budget that pauses the run when it is spent.
harness.register_agent(
    harness.Agent(
        name="budgeted-bot",
        model=harness.OpenAIModel("gpt-test", timeout=5, max_tokens=100),
        tools=[effect],
        max_tokens=1000,
        on_budget="pause",
    )
)


class Receipt(pydantic.BaseModel):
    """What an effect did, as a structured answer."""

    effect: int
    done: bool

    @pydantic.field_validator("done")
    @classmethod
    def truthful(cls, value: bool) -> bool:
        if not value:
            raise ValueError("say done only when it is")
        return value


# Structured answers (Agent(output_type=...)): one retry of an invalid answer.
for bot, provider_model in (
    ("structured-openai", harness.OpenAIModel("gpt-test", timeout=5)),
    ("structured-anthropic", harness.AnthropicModel("claude-test", timeout=5)),
):
    harness.register_agent(
        harness.Agent(
            name=bot, model=provider_model, tools=[effect], output_type=Receipt, output_retries=1
        )
    )
