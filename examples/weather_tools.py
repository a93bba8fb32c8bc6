"""The weather agents' one tool, shared by ``weather.py`` and ``offline.py``."""

from __future__ import annotations

import harness

#: A stand-in for a weather API, so the example needs nothing but the model.
CONDITIONS = {
    "oslo": {"celsius": -3, "sky": "snow"},
    "lisbon": {"celsius": 17, "sky": "sunny"},
    "paris": {"celsius": 9, "sky": "rain"},
}


@harness.tool(effect="read_only")
def current_weather(city: str) -> dict[str, object]:
    """The current temperature in Celsius and the sky in a city."""
    found = CONDITIONS.get(city.strip().lower())
    if found is None:
        raise ValueError(f"no weather station in {city!r}; try one of {sorted(CONDITIONS)}")
    return {"city": city, **found}
