"""``harness.MCPServer``: the tools of a Model Context Protocol server.

Through the official ``mcp`` SDK (the extra ``mcp``), over stdio (``command``
and ``args``: a server process per worker process, harness.toolsets.sessions)
or streamable HTTP (``url``, ``headers``). Each tool the server lists is
offered with its own description and JSON schema, under its own name or
``{prefix}_{name}``. Its effect comes from its annotations, as MCP defines
them: ``readOnlyHint`` → ``read_only``, else ``idempotentHint`` →
``idempotent``, else ``at_most_once`` (a tool that says nothing may destroy
and is not idempotent), unless ``effects`` names it. A call carries the
step's idempotency key in the request's ``_meta`` under
``harness/idempotency_key``, so a server can dedupe on it.

A call's answer: ``isError`` is an error result the model sees;
``structuredContent`` is kept as JSON, else the text content (one text: the
string; other content: its JSON). A server that cannot be started or
reached is :class:`~harness.errors.ToolUnavailable`: the step is retried
after a back-off; a connection that broke during the call may have let the
call through, so an ``at_most_once`` call is then in doubt.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO, cast
from urllib.parse import urlsplit

from harness import inputs
from harness.errors import (
    BadInput,
    ConfigError,
    InvalidToolArgs,
    ToolError,
    ToolResultError,
    ToolUnavailable,
)
from harness.records import JSON
from harness.tools import ToolContext, ToolEffect, ToolSpec, check_tool_name
from harness.toolsets import OfferedTool, ToolsetError, ToolsetUnavailable, mcp_http

if TYPE_CHECKING:
    import mcp_types
    from mcp.client import Transport

    from harness.toolsets import sessions

log = logging.getLogger(__name__)

#: Where a call's ``_meta`` carries the step's idempotency key.
IDEMPOTENCY_META = "harness/idempotency_key"
#: Seconds a listing of the server's tools may take.
LIST_TIMEOUT = 60.0
#: Seconds a call may wait for its answer, by default (``MCPServer(timeout=...)``).
CALL_TIMEOUT = 300.0
#: Pages of a tool listing read at most (a server that pages forever).
MAX_PAGES = 50
#: Effects from the least strict to the most: a call's own options may make
#: a recorded effect stricter, never looser.
_STRICTNESS = (ToolEffect.READ_ONLY, ToolEffect.IDEMPOTENT, ToolEffect.AT_MOST_ONCE)


class MCPServer:
    """The tools of one MCP server, for ``Agent(tools=[...])``.

    ``command``, ``args``, ``env``: the program to start and talk to over
    stdio (``env`` adds to the SDK's default environment); or ``url`` (and
    ``headers``) of a streamable HTTP server. ``prefix``: offer the tools as
    ``{prefix}_{name}``. ``effects``: ``{"tool": "idempotent", ...}``,
    overriding what the annotations say. ``requires_approval``: names of
    tools whose every call waits for an operator, as a function tool's do.
    Tools are named in ``effects`` and ``requires_approval`` as the server
    names them. ``timeout``: seconds a call may wait for its answer; one that
    gets none is treated as a connection broken during the call."""

    def __init__(
        self,
        name: str,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str | None = None,
        effects: Mapping[str, str | ToolEffect] | None = None,
        requires_approval: Iterable[str] = (),
        timeout: float = CALL_TIMEOUT,
    ) -> None:
        if importlib.util.find_spec("mcp") is None:  # looked for, not imported: cheap
            raise ConfigError(
                "MCPServer needs the 'mcp' extra: pip install -e '.[mcp]' in the harness's clone"
            )
        if not isinstance(name, str) or not name.strip():
            raise ValueError("an MCP server needs a name")
        if (command is None) == (url is None):
            raise ValueError(f"MCP server {name!r}: give either command (stdio) or url (HTTP)")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"MCP server {name!r}: args must be a sequence of strings")
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"MCP server {name!r}: url must be http:// or https://, not {url!r}")
        if url is None and headers:
            raise ValueError(f"MCP server {name!r}: headers are for a url, not a command")
        if prefix is not None:
            check_tool_name(f"{prefix}_x")
        if not timeout > 0:
            raise ValueError(f"MCP server {name!r}: timeout must be a positive number of seconds")
        self.timeout = float(timeout)
        self.name = name
        self.command = command
        self.args = tuple(args)
        self.env = _strings(env, "env", name)
        self.url = url
        self.headers = _strings(headers, "headers", name)
        self.prefix = prefix
        self.effects = {tool: _effect(e, tool, name) for tool, e in (effects or {}).items()}
        self.requires_approval = frozenset(
            [requires_approval] if isinstance(requires_approval, str) else requires_approval
        )

    def __repr__(self) -> str:
        where = self.url or " ".join((self.command or "", *self.args))
        return f"<MCPServer {self.name} {where}>"

    def describe(self) -> dict[str, JSON]:
        """The server's definition (headers and env values left out: secrets)."""
        return {
            "mcp_server": self.name,
            "command": self.command,
            "args": list(self.args),
            "env": sorted(self.env or {}),
            "url": self.url,
            "headers": sorted(self.headers or {}),
            "prefix": self.prefix,
            "effects": {tool: e.value for tool, e in sorted(self.effects.items())},
            "requires_approval": sorted(self.requires_approval),
        }

    # -- listing -----------------------------------------------------------------

    def list_offered(self) -> list[OfferedTool]:
        """The tools the server lists now, as a run is offered them."""
        from harness.toolsets import sessions  # loads asyncio: not at import

        try:
            listed = sessions.run(self._list, LIST_TIMEOUT)
        except ToolUnavailable as err:
            raise ToolsetUnavailable(str(err)) from None
        except TimeoutError as err:
            raise ToolsetUnavailable(
                f"MCP server {self.name!r}: listing its tools: {err}"
            ) from None
        named = {tool.name for tool in listed}
        for unknown in sorted((set(self.effects) | self.requires_approval) - named):
            log.warning("MCP server %r lists no tool %r (named in its options)", self.name, unknown)
        try:
            return [self._offered(tool) for tool in listed]
        except BadInput as err:  # a schema no column can hold (NaN, too deep)
            raise ToolsetError(f"MCP server {self.name!r}: {err}") from None

    async def _list(self) -> list[mcp_types.Tool]:
        """The server's tools, page by page. An error the server answered
        with leaves the session open (another thread's call may be under way
        on it); only a broken connection is dropped."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        from harness.toolsets import sessions

        session = self._session()
        client = await session.client()
        tools: list[mcp_types.Tool] = []
        cursor = None
        try:
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if cursor is None:
                    break
        except Exception as err:
            if not (isinstance(err, MCPError) and err.error.code != CONNECTION_CLOSED):
                await session.drop(client)
            raise ToolUnavailable(
                f"MCP server {self.name!r}: listing its tools failed: {sessions.reason(err)}",
                sent=False,
            ) from None
        return tools

    def _offered(self, tool: mcp_types.Tool) -> OfferedTool:
        name = tool.name if self.prefix is None else f"{self.prefix}_{tool.name}"
        schema = dict(tool.input_schema or {})
        schema.pop("title", None)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        return OfferedTool(
            name,
            tool.name,
            tool.description or tool.title or "",
            inputs.checked_json(schema, f"schema of {tool.name}"),
            self.effects.get(tool.name) or effect_of(tool.annotations),
            tool.name in self.requires_approval,
        )

    def bind(self, offered: Sequence[OfferedTool]) -> list[ToolSpec]:
        """Callable tools for a run's recorded ``offered`` ones, under this
        server's options as they are now where they are stricter: a deploy
        that makes a tool need approval, or names it a stricter effect, holds
        for runs already in flight (their record says what the options were
        when the run started)."""
        return [MCPTool(self, self._stricter(tool)) for tool in offered]

    def _stricter(self, tool: OfferedTool) -> OfferedTool:
        """``tool`` as recorded, with approval if either the record or the
        options ask for it, and the stricter of the recorded effect and the
        one the options name (none named: the recorded one, so that every
        worker decides the same about a call in doubt)."""
        approval = tool.requires_approval or tool.remote in self.requires_approval
        named = self.effects.get(tool.remote)
        effect = tool.effect if named is None else max(tool.effect, named, key=_STRICTNESS.index)
        if approval == tool.requires_approval and effect is tool.effect:
            return tool
        return replace(tool, requires_approval=approval, effect=effect)

    # -- calling -----------------------------------------------------------------

    def call(
        self, remote: str, arguments: dict[str, Any], key: str, step_left: float | None = None
    ) -> JSON:
        """The server's answer to a call of its tool ``remote``, as JSON, waited
        for :attr:`timeout` seconds at most, or what is left of the step's time
        limit (``step_left``) if that is less. Starting the server is not part
        of that wait, nor is it "sent": a call times out as maybe made only
        once its request was issued."""
        from harness.toolsets import sessions

        started = time.monotonic()
        self._connect(step_left)
        if step_left is not None:
            step_left -= time.monotonic() - started
        wait = self.timeout if step_left is None else min(self.timeout, max(step_left, 0.001))
        gate = sessions.Gate()
        try:
            result = sessions.run(lambda: self._call(remote, arguments, key, gate), wait)
        except TimeoutError:
            if not gate.abandon():
                raise ToolUnavailable(
                    f"MCP server {self.name!r}: not ready for the call of {remote!r} within "
                    f"{wait:g}s; it was not sent",
                    sent=False,
                ) from None
            raise ToolUnavailable(
                f"MCP server {self.name!r}: no answer to the call of {remote!r} within "
                f"{wait:g}s; it may have been made",
                sent=True,
            ) from None
        if result.is_error:
            raise ToolError(f"MCP server {self.name!r}, tool {remote!r}: {_text(result)}")
        if result.structured_content is not None:
            return result.structured_content
        return _content(result)

    def _connect(self, step_left: float | None) -> None:
        """Open the session (start the server) if it is not open, under a
        start-up limit of its own (and the step's): nothing is sent yet."""
        from harness.toolsets import sessions

        session = self._session()
        if session.connected:
            return
        limit = sessions.STARTUP_TIMEOUT + sessions.CLOSE_TIMEOUT  # a close may be under way
        if step_left is not None:
            limit = min(limit, max(step_left, 0.001))
        try:
            sessions.run(session.client, limit)
        except TimeoutError:
            raise ToolUnavailable(
                f"MCP server {self.name!r} could not be started or reached within {limit:g}s",
                sent=False,
            ) from None

    async def _call(
        self, remote: str, arguments: dict[str, Any], key: str, gate: sessions.Gate
    ) -> mcp_types.CallToolResult:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        from harness.toolsets import sessions

        session = self._session()
        client = await session.client()
        reach = mcp_http.reach()
        if not gate.issue():  # the caller gave up waiting before the request went out
            raise ToolUnavailable(f"MCP server {self.name!r}: not ready in time", sent=False)
        try:
            meta = cast("mcp_types.RequestParamsMeta", {IDEMPOTENCY_META: key})
            return await client.call_tool(remote, arguments, meta=meta)
        except MCPError as err:
            if err.error.code != CONNECTION_CLOSED:  # the server answered: its error
                raise ToolError(f"MCP server {self.name!r}, tool {remote!r}: {err}") from None
            broken: Exception = err
        except Exception as err:  # the transport failed (a stream closed, HTTP gone)
            broken = err
        await session.drop(client)
        if reach.refused and not reach.reached:  # an HTTP server that took no connection
            raise ToolUnavailable(
                f"MCP server {self.name!r} could not be reached: connection refused", sent=False
            )
        raise ToolUnavailable(
            f"MCP server {self.name!r}: the connection broke during the call of {remote!r} "
            f"({sessions.reason(broken)}); it may have been made",
            sent=True,
        )

    def connected(self) -> bool:
        """Does this process hold an open session to the server (a stdio
        server it started that has not been seen to exit)?"""
        return self._session().connected

    def _session(self) -> sessions.Session:
        from harness.toolsets import sessions

        key = (self.name, self.command, self.args, _frozen(self.env), self.url)
        return sessions.session((*key, _frozen(self.headers)), self.name, self._transport)

    def _transport(self, errlog: TextIO) -> Transport:
        from mcp import StdioServerParameters, stdio_client

        if self.command is not None:
            params = StdioServerParameters(command=self.command, args=list(self.args), env=self.env)
            return stdio_client(params, errlog=errlog)
        assert self.url is not None
        return mcp_http.transport(self.url, self.headers)


class MCPTool(ToolSpec):
    """One tool of an MCP server, as a run was offered it (its record)."""

    def __init__(self, server: MCPServer, offered: OfferedTool) -> None:
        self.server = server
        self.offered = offered
        self.remote = offered.remote
        self.name = offered.name
        self.effect = offered.effect
        self.description = offered.description
        self.reconcile = None
        self.requires_approval = offered.requires_approval
        self.context_param = None
        self.fn = self._plain_call
        self._validator: Any = None

    def __repr__(self) -> str:
        return f"<MCP tool {self.name} of {self.server.name} effect={self.effect.value}>"

    def _plain_call(self, **kwargs: Any) -> JSON:
        return self.server.call(self.remote, kwargs, "")

    def schema(self) -> dict[str, JSON]:
        return self.offered.schema

    def validate(self, args: dict[str, JSON]) -> dict[str, Any]:
        """The arguments, if they fit the tool's JSON schema; else InvalidToolArgs."""
        if not isinstance(args, dict):
            raise InvalidToolArgs(f"arguments for tool {self.name!r} must be an object")
        import jsonschema  # type: ignore[import-untyped]  # installed with the mcp SDK

        try:
            if self._validator is None:  # made once: a bound tool lives as long as its run's
                schema = self.offered.schema
                self._validator = jsonschema.validators.validator_for(schema)(schema)
            problems = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        except jsonschema.SchemaError:
            return args  # a schema that does not parse: the server checks
        if problems:
            said = "; ".join(
                f"{'.'.join(str(p) for p in e.path) or 'arguments'}: {e.message}"
                for e in problems[:10]
            )
            raise InvalidToolArgs(f"invalid arguments for tool {self.name!r}: {said}")
        return args

    def invoke(
        self, kwargs: dict[str, Any], ctx: ToolContext, timeout: float | None = None
    ) -> JSON:
        result = self.server.call(self.remote, kwargs, ctx.idempotency_key, timeout)
        try:
            return inputs.checked_json(result, "result")
        except BadInput as err:
            raise ToolResultError(
                f"tool {self.name!r} answered with a value that cannot be kept: {err.problem}"
            ) from None


def effect_of(annotations: mcp_types.ToolAnnotations | None) -> ToolEffect:
    """A tool's effect from its MCP annotations (MCP's defaults where it says nothing)."""
    if annotations is not None and annotations.read_only_hint:
        return ToolEffect.READ_ONLY
    if annotations is not None and annotations.idempotent_hint:
        return ToolEffect.IDEMPOTENT
    return ToolEffect.AT_MOST_ONCE


def _text(result: mcp_types.CallToolResult) -> str:
    texts = [str(getattr(c, "text", "")) for c in result.content if c.type == "text"]
    return "\n".join(texts) or "the tool reported an error"


def _content(result: mcp_types.CallToolResult) -> JSON:
    """Unstructured content as JSON: the text of one text item, else each item's JSON."""
    items = result.content
    if len(items) == 1 and getattr(items[0], "type", None) == "text":
        return str(getattr(items[0], "text", ""))
    dumped: list[JSON] = [i.model_dump(mode="json", exclude_none=True) for i in items]
    return dumped


def _effect(value: str | ToolEffect, tool: str, server: str) -> ToolEffect:
    try:
        return ToolEffect(value)
    except ValueError:
        choices = ", ".join(e.value for e in ToolEffect)
        raise ValueError(
            f"MCP server {server!r}: effect of {tool!r} must be one of {choices}, not {value!r}"
        ) from None


def _strings(values: Mapping[str, str] | None, what: str, server: str) -> dict[str, str] | None:
    if values is None:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise ValueError(f"MCP server {server!r}: {what} must map strings to strings")
    return dict(values)


def _frozen(values: dict[str, str] | None) -> tuple[tuple[str, str], ...] | None:
    return None if values is None else tuple(sorted(values.items()))
