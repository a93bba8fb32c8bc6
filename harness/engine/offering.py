"""The tools a run is offered by its agent's toolsets, recorded with the run.

The tools of an MCP server are known only by asking it, and the server may
add, change or drop one at any time (harness.toolsets). So that a run in
flight is not changed under it, the tools a run is offered are read once,
when a worker first carries the run, and recorded with it
(``harness_run_tools``, first writer wins): names, descriptions, JSON schemas
and effects. Every later step of that run, on any worker, offers and calls
the tools of that record; a call of a tool the server has dropped since is
the server's error, which the model sees.

The runner asks :func:`for_run` for the agent a run is carried by: the agent
itself when it has no toolsets, else a copy whose tools are its function
tools plus the recorded ones (:func:`bind`). A replay is offered the tools of
the run it replays (its calls are served from that recording, and need no
server); a fork, a new run, reads the servers anew.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.agents import Agent
from harness.output import FINAL_TOOL
from harness.records import JSON, Run
from harness.tools import ToolSpec, check_tool_name
from harness.toolsets import OfferedTool, Toolset, ToolsetError

if TYPE_CHECKING:
    from harness.store import Store

#: The most tools one run may be offered (OpenAI's limit for one request).
MAX_TOOLS = 128
#: The most bytes the record of a run's offered tools may take, as JSON.
MAX_RECORD = 1 << 20
#: Runs whose record this process has read: a record never changes once written.
_CACHED = 4096


def check_offered(agent: Agent, listings: dict[str, list[OfferedTool]]) -> None:
    """Refuse, with a :class:`ToolsetError` that says which and why, listings
    that no provider would take: a bad name, a name taken twice, too many."""
    taken = {spec.name: "a function tool" for spec in agent.tool_specs}
    if agent.output_type is not None:
        taken[FINAL_TOOL] = "the tool its structured answer is asked for with (output_type)"
    for toolset, offered in listings.items():
        for tool in offered:
            try:
                check_tool_name(tool.name)
            except ValueError as err:
                raise ToolsetError(f"server {toolset!r} offers a tool {err}") from None
            where = f"server {toolset!r}"
            if tool.name in taken:
                raise ToolsetError(
                    f"agent {agent.name!r}: {where} offers a tool named {tool.name!r}, "
                    f"the name of {taken[tool.name]}: give the server a prefix"
                )
            taken[tool.name] = f"a tool of {where}"
    if len(taken) > MAX_TOOLS:
        raise ToolsetError(
            f"agent {agent.name!r} would offer {len(taken)} tools: at most {MAX_TOOLS}"
        )


def bind(agent: Agent, listings: dict[str, list[OfferedTool]]) -> Agent:
    """``agent`` with the tools of ``listings`` (by toolset name) beside its
    function tools: what a run that was offered them is carried by."""
    specs: list[ToolSpec | Toolset] = list(agent.tool_specs)
    for toolset in agent.toolsets:
        specs += toolset.bind(listings.get(toolset.name, []))
    try:
        return replace(agent, tools=specs)
    except ValueError as err:  # a function tool deployed since, or a replay's other agent
        raise ToolsetError(f"the tools recorded for the run do not fit the agent: {err}") from None


def encode(listings: dict[str, list[OfferedTool]]) -> dict[str, JSON]:
    """The record of a run's offered tools, as stored."""
    record: dict[str, JSON] = {
        name: [tool.to_dict() for tool in offered] for name, offered in listings.items()
    }
    size = len(json.dumps(record))
    if size > MAX_RECORD:
        raise ToolsetError(
            f"the tools offered take {size} bytes as JSON: at most {MAX_RECORD} are recorded"
        )
    return record


def decode(record: JSON) -> dict[str, list[OfferedTool]]:
    assert isinstance(record, dict)
    listings = {}
    for name, offered in record.items():
        assert isinstance(offered, list)
        listings[name] = [OfferedTool.from_dict(t) for t in offered if isinstance(t, dict)]
    return listings


@dataclass(frozen=True)
class _Bound:
    """A run's record as read, and the agent bound to it (for ``agent``)."""

    listings: dict[str, list[OfferedTool]]
    agent: Agent
    bound: Agent


class _Recorded:
    """The records this process has read, by run, with the agent bound to
    each (bounded: least recent out). A record never changes once written."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], _Bound] = OrderedDict()

    def get(self, key: tuple[str, str]) -> _Bound | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, str], bound: _Bound) -> None:
        with self._lock:
            self._items[key] = bound
            while len(self._items) > _CACHED:
                self._items.popitem(last=False)


_recorded = _Recorded()


def for_run(store: Store, agent: Agent, run: Run, now: float, *, live: bool = True) -> Agent:
    """The agent that carries ``run``: with the tools recorded for it.

    No record yet: with ``live``, the toolsets are listed now and the listing
    recorded (another worker's, recorded first, wins and is used); without,
    only the function tools are known (an operator's command on a run whose
    first step has not run). Raises :class:`ToolsetUnavailable` (a server
    not reachable: the run waits for it) or :class:`ToolsetError` (a listing
    no provider takes, or a record that clashes with the agent's tools as
    deployed now: the run fails).
    The record is read once per run in a process, and bound once per agent."""
    if not agent.toolsets:
        return agent
    key = (run.run_id, run.lineage)  # an import after a prune is another run
    cached = _recorded.get(key)
    if cached is not None and cached.agent is agent:
        return cached.bound
    listings = cached.listings if cached is not None else _listings(store, agent, run, now, live)
    if listings is None:
        return agent
    bound = bind(agent, listings)
    _recorded.put(key, _Bound(listings, agent, bound))
    return bound


def _listings(
    store: Store, agent: Agent, run: Run, now: float, live: bool
) -> dict[str, list[OfferedTool]] | None:
    """The run's record (a replay's: its recording's), made now if ``live``."""
    stored = store.offered_tools(run.run_id)
    if stored is None and run.replay_of is not None:
        stored = store.offered_tools(run.replay_of.run_id)
    if stored is None:
        if not live:
            return None
        fresh = {toolset.name: toolset.list_offered() for toolset in agent.toolsets}
        check_offered(agent, fresh)
        stored = store.offer_tools(run.run_id, encode(fresh), now)
    return decode(stored)
