"""Toolsets: tools that a server offers, known only when it is asked.

A function tool is known when its module is imported; the tools of a Model
Context Protocol server (:class:`harness.MCPServer`) are known only by asking
the server, and the server may add, change or drop one at any time. So that
a run in flight is not changed under it, the tools a run is offered are read
once, when a worker first carries the run, and recorded with the run
(``harness_run_tools``, first writer wins): names, descriptions, JSON schemas
and effects. Every later step of that run, on any worker, offers and calls
the tools of that record; a call of a tool the server has dropped since is
the server's error, which the model sees.

:mod:`harness.engine.offering` binds the recorded tools to the run's agent.
- :mod:`~harness.toolsets.mcp`: :class:`harness.MCPServer`, through the ``mcp`` SDK.
- :mod:`~harness.toolsets.sessions`: this process's MCP sessions, on a loop of their own.
- :mod:`~harness.toolsets.mcp_http`: streamable HTTP; did a call's request reach the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from harness.errors import HarnessError
from harness.records import JSON
from harness.tools import ToolEffect, ToolSpec


class ToolsetError(HarnessError):
    """A toolset's listing cannot be offered as it is: a name the providers
    refuse, two tools of one name, too many tools; or a run's record of its
    tools that the agent as deployed now cannot take (a function tool added
    under a recorded name). The run fails with it: no retry would help."""


class ToolsetUnavailable(HarnessError):
    """A toolset's server could not be started or reached to list its tools;
    the message is the server's own where it gave one. The step is tried
    again later (:func:`for_run`'s caller leaves the run to the sweeper)."""


@dataclass(frozen=True)
class OfferedTool:
    """One tool of a toolset as a run is offered it, and as it is recorded.

    ``name``: the name the model sees (the server's, or ``{prefix}_{name}``);
    ``remote``: the server's own name for it, which a call uses."""

    name: str
    remote: str
    description: str
    schema: dict[str, JSON]
    effect: ToolEffect
    requires_approval: bool = False

    def to_dict(self) -> dict[str, JSON]:
        return {
            "name": self.name,
            "remote": self.remote,
            "description": self.description,
            "schema": self.schema,
            "effect": self.effect.value,
            "requires_approval": self.requires_approval,
        }

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> OfferedTool:
        schema = data["schema"]
        assert isinstance(schema, dict)
        return cls(
            str(data["name"]),
            str(data["remote"]),
            str(data.get("description") or ""),
            schema,
            ToolEffect(str(data["effect"])),
            bool(data.get("requires_approval", False)),
        )


@runtime_checkable
class Toolset(Protocol):
    """What an agent's ``tools`` may hold beside function tools: a named
    source of tools that are listed live and called through it."""

    name: str

    def list_offered(self) -> list[OfferedTool]:
        """The tools offered now (asks the server); ToolsetUnavailable if it cannot."""

    def bind(self, offered: Sequence[OfferedTool]) -> list[ToolSpec]:
        """Callable tools for the recorded ``offered`` ones."""

    def describe(self) -> dict[str, JSON]:
        """What defines the toolset, as JSON (the agent catalog's definition hash)."""
