"""The agent catalog: which agents the live workers carry.

A run names its agent, and only a worker that has the agent's code can carry
it; the process that starts a run does not need that code, as Celery's
``send_task`` does not need a task's. So each worker publishes the agents it
registered to the store when it starts (:class:`Publisher`, driven by
:mod:`harness.celery.publishing`), refreshes its rows every :data:`REFRESH`
seconds while it lives, and deletes them when it stops cleanly. A worker is
live while its rows were refreshed within :data:`LIVE` seconds; a dead one's
rows drop out of the listing then, and are deleted after :data:`FORGET`.

``harness start`` and ``POST /api/runs`` accept an agent registered in their
own process (as before: no round trip) or carried by a live worker, and
refuse any other naming every agent known (:func:`require`).
``harness agents`` and ``GET /api/agents`` list the live catalog
(:func:`live_agents`).

What defines an agent's behaviour is hashed (:func:`definition_hash`), so
that workers running different releases of one agent show up: its name; its
model (the class, and for a provider model its model name, system prompt,
timeout and request parameters, for a ``ScriptedModel`` its turns, for a
model class of your own the class and, if the class defines one, its
``repr`` without memory addresses); its ``output_type``'s JSON schema; each
tool's name, effect, approval, description, argument schema and whether it
has a ``reconcile``; each toolset's definition (an MCP server's command,
arguments, URL, prefix, effects and approvals; the names of its environment
variables and headers, not their values); and every other field of the
``Agent`` (its limits and policies: ``max_steps``, ``max_tokens``,
``on_tool_error``...). Not the tools' code: a changed
function body under the same signature hashes alike. Two live workers
publishing different hashes for one agent are a mixed release: logged as a
WARNING by each worker that sees it, once, and marked in the listing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pydantic.errors import PydanticUserError

from harness.agents import Agent, get_agent, registered_agents
from harness.clock import Clock
from harness.errors import AgentNotFound
from harness.models import AsyncModel, Model, ScriptedModel
from harness.records import JSON
from harness.store import Catalog, PublishedAgent, PublishedTool
from harness.tools import ToolSpec

log = logging.getLogger(__name__)

#: Seconds between two publishes of a live worker.
REFRESH = 30.0
#: A worker is live while it published within this many seconds: a few
#: refreshes, so a slow or missed one does not hide its agents.
LIVE = 3 * REFRESH
#: Rows not refreshed for this long (a worker long dead) are deleted.
FORGET = 3600.0
#: The longest agent name a run (and the catalog) can store.
MAX_NAME = 200
#: The effect the catalog lists for a toolset's tools (each has its own, per run).
TOOLSET_EFFECT = "per tool"
#: The Agent fields hashed as the definition's parts of their own.
_NOT_LIMITS = ("name", "model", "tools")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


# -- the definition hash -----------------------------------------------------------


def definition(agent: Agent) -> dict[str, JSON]:
    """What defines ``agent``'s behaviour, as JSON (see the module docstring)."""
    limits = {
        f.name: _plain(getattr(agent, f.name))
        for f in dataclasses.fields(agent)
        if f.init and f.name not in _NOT_LIMITS
    }
    if agent.output_type is not None:  # what the answer must be, not just the class's name
        limits["output_type"] = _plain(agent.output_type.model_json_schema())
    described = {
        "name": agent.name,
        "model": _model(agent.model),
        "tools": [_tool(spec) for spec in agent.tool_specs],
        "limits": limits,
    }
    if agent.toolsets:  # the servers' definitions; their tools are listed per run
        described["toolsets"] = [toolset.describe() for toolset in agent.toolsets]
    return described


def definition_hash(agent: Agent) -> str:
    """``sha256:<hex>`` of :func:`definition`, alike in every process."""
    text = json.dumps(definition(agent), sort_keys=True, separators=(",", ":"), default=repr)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _model(model: Model | AsyncModel | str) -> dict[str, JSON]:
    kind = type(model)
    described: dict[str, JSON] = {"class": f"{kind.__module__}.{kind.__qualname__}"}
    if isinstance(model, ScriptedModel):
        described["turns"] = [turn.to_result() for turn in model.turns]
        return described
    from harness.providers.base import ProviderModel  # imports no SDK

    if isinstance(model, ProviderModel):
        described |= {
            "model": model.model,
            "system": model.system,
            "timeout": model.timeout,
            "params": _plain(model.params),
        }
    elif kind.__repr__ is not object.__repr__:  # a repr of its own says what it is
        described["repr"] = _repr(model)
    return described


def _tool(spec: ToolSpec) -> dict[str, JSON]:
    return {
        "name": spec.name,
        "effect": spec.effect.value,
        "requires_approval": spec.requires_approval,
        "description": spec.description,
        "schema": _schema(spec),
        "reconcile": spec.reconcile is not None,
    }


def _schema(spec: ToolSpec) -> JSON:
    """The arguments' JSON schema; for a parameter type that has none (a
    callable, say: valid for a tool a ScriptedModel calls), each parameter's
    annotation and default instead."""
    try:
        return _plain(spec.args_model.model_json_schema())
    except PydanticUserError:
        fields = spec.args_model.model_fields
        return {name: [_repr(f.annotation), _repr(f.default)] for name, f in fields.items()}


def _plain(value: object) -> JSON:
    """``value`` as JSON: containers as lists and objects, a class by its
    qualified name, anything else by its ``repr``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return _repr(value)


def _repr(value: object) -> str:
    """``repr(value)`` without memory addresses (``<Client object at 0x7f...>``),
    which differ from process to process for the same definition."""
    return _ADDRESS.sub("", repr(value))


# -- the listing -----------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSeen:
    """A live worker that carries an agent, and the definition it carries."""

    name: str
    last_seen: float
    definition_hash: str

    def to_dict(self) -> dict[str, JSON]:
        return {
            "name": self.name,
            "last_seen": self.last_seen,
            "definition_hash": self.definition_hash,
        }


@dataclass(frozen=True)
class CatalogEntry:
    """An agent some live worker carries. ``definition_hash`` and ``tools``
    are those of the worker that started last (the newest release, in a
    rolling deploy); each worker's own hash is in ``workers``."""

    name: str
    tools: tuple[PublishedTool, ...]
    definition_hash: str
    workers: tuple[WorkerSeen, ...]

    @property
    def definitions(self) -> tuple[str, ...]:
        """The distinct definition hashes live workers carry."""
        return tuple(sorted({w.definition_hash for w in self.workers}))

    @property
    def mixed_release(self) -> bool:
        """Live workers carry different definitions of this agent."""
        return len(self.definitions) > 1

    def to_dict(self) -> dict[str, JSON]:
        """The JSON of ``harness agents --json`` and ``GET /api/agents``."""
        return {
            "name": self.name,
            "tools": [tool.to_dict() for tool in self.tools],
            "definition_hash": self.definition_hash,
            "mixed_release": self.mixed_release,
            "workers": [w.to_dict() for w in self.workers],
        }


def entries(rows: Iterable[PublishedAgent]) -> list[CatalogEntry]:
    """The rows grouped by agent, agents and their workers by name."""
    by_agent: dict[str, list[PublishedAgent]] = {}
    for row in rows:
        by_agent.setdefault(row.agent, []).append(row)
    listed = []
    for name in sorted(by_agent):
        group = sorted(by_agent[name], key=lambda r: r.worker)
        newest = max(group, key=lambda r: (r.started_at, r.last_seen, r.worker))
        workers = tuple(WorkerSeen(r.worker, r.last_seen, r.definition_hash) for r in group)
        listed.append(CatalogEntry(name, newest.tools, newest.definition_hash, workers))
    return listed


def live_agents(store: Catalog, now: float) -> list[CatalogEntry]:
    """The agents the workers live at ``now`` carry."""
    return entries(store.published_agents(now - LIVE))


def require(store: Catalog, name: str, now: float) -> None:
    """Accept ``name`` if it is registered in this process (no round trip) or
    a live worker carries it; otherwise raise AgentNotFound naming both kinds."""
    try:
        get_agent(name)
        return
    except AgentNotFound:
        pass
    published = {row.agent for row in store.published_agents(now - LIVE)}
    if name not in published:
        local = {agent.name for agent in registered_agents()}
        raise AgentNotFound(name, sorted(local | published), catalog=True)


def describe(listed: Sequence[CatalogEntry], now: float) -> list[str]:
    """``harness agents``: each agent's definition, tools and workers."""
    if not listed:
        return [
            "no live worker has published an agent: workers publish theirs to the run "
            "store when they start (is one running, on this HARNESS_DATABASE_URL?)"
        ]
    lines = []
    for entry in listed:
        head = f"{entry.name}  definition {_digits(entry.definition_hash)}"
        if entry.mixed_release:
            head += f"  mixed release: {len(entry.definitions)} definitions"
        lines.append(head)
        tools = ", ".join(_tool_line(tool) for tool in entry.tools) or "none"
        lines.append(f"  tools    {tools}")
        workers = ", ".join(_worker_line(w, entry.mixed_release, now) for w in entry.workers)
        lines.append(f"  workers  {workers}")
    return lines


def _tool_line(tool: PublishedTool) -> str:
    approval = ", approval" if tool.requires_approval else ""
    return f"{tool.name} ({tool.effect}{approval})"


def _worker_line(worker: WorkerSeen, mixed: bool, now: float) -> str:
    """A worker and how long ago it was seen; in a mixed release, its definition."""
    definition = f" {_digits(worker.definition_hash)}" if mixed else ""
    return f"{worker.name}{definition} (seen {max(0.0, now - worker.last_seen):.0f}s ago)"


def _digits(digest: str) -> str:
    """A definition hash as ``harness agents`` shows it: its first 12 hex digits."""
    return digest.removeprefix("sha256:")[:12]


# -- publishing ------------------------------------------------------------------


class Publisher:
    """Publishes the agents registered in this process as worker ``worker``.

    ``publish`` writes them all each time (cheap: one short transaction every
    :data:`REFRESH` seconds), so a row deleted meanwhile comes back, and says
    once, as a WARNING, when a live worker carries another definition of one.
    """

    def __init__(
        self,
        store: Catalog,
        worker: str,
        clock: Clock,
        agents: Callable[[], Sequence[Agent]] = registered_agents,
    ) -> None:
        self.store = store
        self.worker = worker
        self.clock = clock
        self.agents = agents
        self._started_at: float | None = None
        self._published = False  # once: then the start is logged
        self._mixed: frozenset[tuple[str, str, str]] = frozenset()

    def publish(self) -> None:
        """Write this worker's rows, seen now; warn of a new mixed release."""
        now = self.clock.now()
        if self._started_at is None:
            self._started_at = now
        first = not self._published
        mine = [self._row(agent, now) for agent in self._publishable(first)]
        self.store.publish_agents(self.worker, mine, forget_before=now - FORGET)
        self._published = True
        if first:
            names = ", ".join(sorted(row.agent for row in mine)) or "none"
            log.info("agent catalog: worker %s carries %s", self.worker, names)
        self._warn_of_mixed_releases(mine, self.store.published_agents(now - LIVE))

    def withdraw(self) -> None:
        """Delete this worker's rows: it stops."""
        self.store.withdraw_agents(self.worker)

    def _publishable(self, first: bool) -> list[Agent]:
        """The registered agents a row can name: one whose name is longer than
        a run's ``agent`` column (no run of it could be stored anyway) is left
        out, said once, rather than failing the publish of every other."""
        fits = []
        for agent in self.agents():
            if len(agent.name) <= MAX_NAME:
                fits.append(agent)
            elif first:
                log.warning(
                    "agent catalog: agent %r... not published: its name is longer than %d "
                    "characters, and no run of it can be stored",
                    agent.name[:40],
                    MAX_NAME,
                )
        return fits

    def _row(self, agent: Agent, now: float) -> PublishedAgent:
        assert self._started_at is not None
        tools = tuple(
            PublishedTool(spec.name, spec.effect.value, spec.requires_approval)
            for spec in agent.tool_specs
        ) + tuple(
            # A server's tools are known per run: listed as the server, "name:*".
            PublishedTool(f"{toolset.name}:*", TOOLSET_EFFECT, False)
            for toolset in agent.toolsets
        )
        return PublishedAgent(
            self.worker, agent.name, definition_hash(agent), tools, self._started_at, now
        )

    def _warn_of_mixed_releases(
        self, mine: Sequence[PublishedAgent], live: Sequence[PublishedAgent]
    ) -> None:
        carried = {row.agent: row.definition_hash for row in mine}
        mixed = frozenset(
            (row.agent, row.worker, row.definition_hash)
            for row in live
            if row.worker != self.worker
            and row.agent in carried
            and row.definition_hash != carried[row.agent]
        )
        for agent, other, theirs in sorted(mixed - self._mixed):
            log.warning(
                "agent catalog: mixed release of agent %r: this worker %s carries "
                "definition %s, worker %s carries %s; runs may be carried by either",
                agent,
                self.worker,
                _short(carried[agent]),
                other,
                _short(theirs),
            )
        self._mixed = mixed


def _short(digest: str) -> str:
    """A definition hash as logs and tables show it: ``sha256:`` and 12 hex digits."""
    return digest[: len("sha256:") + 12]
