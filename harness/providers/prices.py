"""What a model turn cost: a price table, from ``HARNESS_PRICES``.

The table is JSON: model names (as the agent names them,
``"openai:gpt-4.1-mini"``, or bare, ``"gpt-4.1-mini"``) to US dollars per
million tokens::

    {"openai:gpt-4.1-mini": {"input": 0.40, "output": 1.60, "cached_input": 0.10},
     "anthropic:claude-sonnet-4-5": {"input": 3, "output": 15,
                                     "cached_input": 0.30, "cache_write": 3.75}}

``cached_input`` (default: ``input``) prices input tokens served from the
provider's prompt cache, ``cache_write`` (default: ``input``) those written to
it. A turn's ``input_tokens`` are all its input tokens, cached or not, for
every provider (as OpenAI counts them; Anthropic's cache reads and writes are
added in when its response is read); the cached ones, under each provider's
own names in the usage (OpenAI's ``cached_tokens``, Anthropic's
``cache_read_input_tokens`` and ``cache_creation_input_tokens``), are priced
at their rates instead of ``input``. A model missing from the table has no cost (None), which
``show`` prints as null rather than a made-up zero. No prices are built in:
they change, and a stale table would be wrong in silence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.errors import ConfigError
from harness.models import Usage

_FIELDS = ("input", "output", "cached_input", "cache_write")
PER = 1_000_000


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None

    def cost(self, usage: Usage) -> float:
        cached_in = self.input if self.cached_input is None else self.cached_input
        write = self.input if self.cache_write is None else self.cache_write
        details = usage.details
        read = details.get("cached_tokens", 0) + details.get("cache_read_input_tokens", 0)
        written = details.get("cache_creation_input_tokens", 0)
        # Never below zero: a usage recorded before cache tokens were counted in.
        uncached = max(0, usage.input_tokens - read - written)
        dollars = uncached * self.input + read * cached_in + written * write
        dollars += usage.output_tokens * self.output
        return round(dollars / PER, 10)


@dataclass(frozen=True)
class Prices:
    """The price table; empty by default."""

    table: Mapping[str, Price] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Prices:
        """``HARNESS_PRICES``; ConfigError naming what is wrong."""
        if not text.strip():
            return cls()
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"HARNESS_PRICES is not JSON: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError("HARNESS_PRICES must be a JSON object of model names to prices")
        table = {}
        for model, entry in raw.items():
            if not isinstance(entry, dict) or not {"input", "output"} <= entry.keys():
                raise ConfigError(
                    f"HARNESS_PRICES[{model!r}] needs 'input' and 'output' (USD per 1M tokens)"
                )
            unknown = set(entry) - set(_FIELDS)
            if unknown:
                raise ConfigError(
                    f"HARNESS_PRICES[{model!r}]: unknown {sorted(unknown)}; known: {_FIELDS}"
                )
            values = {}
            for name, value in entry.items():
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not 0 <= value < math.inf  # NaN and Infinity parse as JSON here
                ):
                    raise ConfigError(
                        f"HARNESS_PRICES[{model!r}][{name!r}] must be a finite number >= 0"
                    )
                values[name] = float(value)
            table[model] = Price(**values)
        return cls(table)

    def cost(self, model: str, usage: Usage) -> float | None:
        """The turn's price in US dollars; None if the model has no price."""
        price = self.table.get(model) or self.table.get(model.partition(":")[2])
        return None if price is None else price.cost(usage)
