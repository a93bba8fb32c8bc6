"""An agent whose tool and model are ``async def``: they run on the worker
thread's own event loop, kept from one call to the next, so a client bound to
that loop (here a stand-in for ``httpx.AsyncClient``) is made once and reused.
From the repository root (``examples`` is not installed with the package)::

    export HARNESS_IMPORTS=examples.async_tools
    celery -A tasks worker --pool=threads --concurrency=4 & celery -A tasks beat &
    harness start forecaster "Oslo or Lisbon for the weekend?" --json
"""

from __future__ import annotations

import asyncio
import weakref

import harness
from examples.weather_tools import CONDITIONS


class StationClient:
    """Stands in for an async HTTP client: usable only on the loop it was made on."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.requests = 0

    async def get(self, city: str) -> dict[str, object]:
        assert asyncio.get_running_loop() is self.loop, "a client used on another loop"
        self.requests += 1
        await asyncio.sleep(0.05)  # the network
        found = CONDITIONS.get(city.strip().lower())
        if found is None:
            raise ValueError(f"no weather station in {city!r}; try one of {sorted(CONDITIONS)}")
        return {"city": city, **found}


#: One client per event loop: one per worker thread, made on its first call.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StationClient] = (
    weakref.WeakKeyDictionary()
)


def _client() -> StationClient:
    loop = asyncio.get_running_loop()
    if loop not in _clients:
        _clients[loop] = StationClient()
    return _clients[loop]


@harness.tool(effect="read_only")
async def forecast(city: str) -> dict[str, object]:
    """The current temperature in Celsius and the sky in a city."""
    client = _client()
    found = await client.get(city)
    return {**found, "client_requests": client.requests}


class Forecaster:
    """A model of your own whose ``next_turn`` is a coroutine function (an
    async SDK's call, say): it asks for both forecasts, then answers."""

    records_responses = False  # deterministic: nothing to pay for twice

    async def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        await asyncio.sleep(0.01)  # the provider
        if request.turn == 0:
            cities = [{"name": "forecast", "args": {"city": c}} for c in ("Oslo", "Lisbon")]
            return harness.ModelTurn.parse({"tool_calls": cities})
        return harness.ModelTurn(final="Lisbon: 17 C and sunny, against -3 C and snow in Oslo.")


harness.register_agent(harness.Agent(name="forecaster", model=Forecaster(), tools=[forecast]))
