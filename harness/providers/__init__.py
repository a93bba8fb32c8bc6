"""Real models: OpenAI's Chat Completions and Anthropic's Messages APIs.

Each provider is reached through its official SDK, an optional extra
(``pip install -e '.[openai]'`` in the clone, ``[anthropic]``), imported
only when a model of it is built. What they share (the conversation rebuilt
from the stored steps, tool schemas, the shared rate limits, which failures
are worth retrying) lives in :mod:`harness.providers.base`.
"""

from __future__ import annotations

from typing import Any

from harness.errors import ConfigError
from harness.providers.anthropic import AnthropicModel
from harness.providers.base import ProviderModel
from harness.providers.openai import OpenAIModel

__all__ = ["AnthropicModel", "OpenAIModel", "ProviderModel", "model_from_name"]

PROVIDERS: dict[str, type[ProviderModel]] = {"openai": OpenAIModel, "anthropic": AnthropicModel}


def model_from_name(name: str, **options: Any) -> ProviderModel:
    """``"openai:gpt-4.1-mini"`` or ``"anthropic:claude-sonnet-4-5"``: the
    provider's model, with ``options`` (``system=...``, request parameters)."""
    provider, _, model = name.partition(":")
    if provider not in PROVIDERS or not model:
        known = ", ".join(f"'{p}:MODEL'" for p in PROVIDERS)
        raise ConfigError(f"model {name!r}: expected {known}")
    return PROVIDERS[provider](model, **options)
