"""Tools: the ``@harness.tool`` decorator, argument validation and effects.

A tool declares its effect, which decides what happens when a crash leaves
its step RUNNING and nobody knows whether the call went out:

* ``read_only``: no effect on the world; simply called again.
* ``idempotent``: safe to repeat with the same idempotency key; called again
  with the key of the first attempt, which the tool should pass downstream.
* ``at_most_once``: never repeated while in doubt; the step becomes
  ``in_doubt`` and the run waits for an operator.

A tool (and its ``reconcile``) may be an ``async def``: its coroutine runs on
the calling thread's event loop (harness.aio), kept from call to call, and
is cancelled at the step's time limit. Everything else (validation, effects,
results, ``Deferred``) is the same as for a plain function.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, get_args, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from harness import aio
from harness.errors import BadInput, InvalidToolArgs, StepTimedOut, ToolResultError
from harness.inputs import checked_json
from harness.records import JSON, Step, idempotency_key
from harness.waiting import Deferred, Sleep, marker, refuse_marker


class ToolEffect(StrEnum):
    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    AT_MOST_ONCE = "at_most_once"

    @property
    def safe_to_repeat(self) -> bool:
        return self is not ToolEffect.AT_MOST_ONCE


@dataclass(frozen=True)
class Happened:
    """A reconcile verdict: the interrupted call did take effect, with this result."""

    result: JSON = None


@dataclass(frozen=True)
class NotHappened:
    """A reconcile verdict: the interrupted call never took effect; call it again."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the step calling it, and what it may ask
    of the harness to wait on the world (:meth:`callback_url`,
    :meth:`start_child`)."""

    run_id: str
    step_index: int
    attempt: int
    #: The engine's side of waiting (set by the worker; None in plain calls).
    hooks: WaitHooks | None = field(default=None, compare=False, repr=False)
    #: The run's steps as stored, read when called (set by the worker; None in
    #: plain calls): what a tool that replays a framework's agent up to its own
    #: call needs (harness.pydantic_agents).
    steps: Callable[[], list[Step]] | None = field(default=None, compare=False, repr=False)

    @property
    def idempotency_key(self) -> str:
        """``"{run_id}:{step_index}"``: the same on every attempt of this step."""
        return idempotency_key(self.run_id, self.step_index)

    def callback_url(self, expires_in: float | None = None) -> str:
        """A URL under HARNESS_PUBLIC_URL that answers this step once: POST a
        JSON body to it (the call's result; ``{"error": "..."}`` makes it a
        failed call). Good for ``expires_in`` seconds (default 30 days).
        Return :class:`harness.Deferred` after handing it out. Raises
        ConfigError without HARNESS_CALLBACK_SECRET."""
        return self._hooks().callback_url(self, expires_in)

    def start_child(self, agent: object, goal: str) -> Deferred:
        """Start a run of ``agent`` (an Agent or its name) on ``goal``, once
        (its id is ``{run_id}:{step_index}``, whatever the attempt), and
        return the :class:`harness.Deferred` that waits for its end: return it."""
        name = agent if isinstance(agent, str) else getattr(agent, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"start_child takes an Agent or an agent's name, not {agent!r}")
        return self._hooks().start_child(self, name, goal)

    def history(self) -> list[Step]:
        """The run's steps, as the store holds them now (this one included)."""
        if self.steps is None:
            raise RuntimeError("this ToolContext was not made by a harness worker: no history")
        return self.steps()

    def _hooks(self) -> WaitHooks:
        if self.hooks is None:
            raise RuntimeError(
                "this ToolContext was not made by a harness worker: waiting needs one"
            )
        return self.hooks


class WaitHooks(Protocol):
    """What a worker gives a tool's context to wait on the world (harness.engine.waits)."""

    def callback_url(self, ctx: ToolContext, expires_in: float | None) -> str: ...

    def start_child(self, ctx: ToolContext, agent: str, goal: str) -> Deferred: ...


#: Asked after a crash whether an at_most_once call happened: ``Happened(result)``,
#: ``NotHappened()``, or ``None`` when it cannot tell (the step stays in doubt).
#: It may be an ``async def``.
Reconcile = Callable[
    [ToolContext], Happened | NotHappened | Awaitable[Happened | NotHappened | None] | None
]


class ToolSpec:
    """A registered tool: the function, its effect and its argument model."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        effect: ToolEffect,
        description: str,
        reconcile: Reconcile | None = None,
        requires_approval: bool = False,
    ) -> None:
        self.fn = fn
        self.name = name
        self.effect = effect
        self.description = description
        self.reconcile = reconcile
        self.requires_approval = requires_approval
        if inspect.isasyncgenfunction(fn):
            raise TypeError(f"tool {name!r}: an async generator is not a tool; return a value")
        self.context_param, self.args_model = _argument_model(fn, name)
        self._schema: str | None = None

    @property
    def is_async(self) -> bool:
        """Declared ``async def``: a call returns a coroutine to run."""
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the plain function (tests, other code): no harness involved.
        For an ``async def`` tool this is its coroutine: ``await`` it."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<tool {self.name} effect={self.effect.value}>"

    def schema(self) -> dict[str, JSON]:
        """The JSON schema of the tool's arguments, as offered to a model: from
        its type hints (a ``ToolContext`` parameter is not an argument). Made
        once (pydantic's generation took a third of a millisecond, on every
        model turn, per tool offered), kept as JSON text: each caller gets a
        copy of its own."""
        if self._schema is None:
            schema: dict[str, JSON] = self.args_model.model_json_schema()
            schema.pop("title", None)
            schema.setdefault("properties", {})
            self._schema = json.dumps(schema)
        made: dict[str, JSON] = json.loads(self._schema)
        return made

    def validate_edit(self, args: dict[str, JSON]) -> None:
        """Arguments an operator gives with ``harness approve --args``:
        refused now (:class:`InvalidToolArgs`, or :class:`BadInput` from a
        tool that takes no edited arguments) rather than later."""
        self.validate(args)

    def validate(self, args: dict[str, JSON]) -> dict[str, Any]:
        """Validated keyword arguments, or :class:`InvalidToolArgs` with every problem."""
        if not isinstance(args, dict):
            raise InvalidToolArgs(f"arguments for tool {self.name!r} must be an object")
        try:
            model = self.args_model.model_validate(args)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in err.errors()
            )
            raise InvalidToolArgs(f"invalid arguments for tool {self.name!r}: {problems}") from None
        return {field: getattr(model, field) for field in type(model).model_fields}

    def invoke(
        self, kwargs: dict[str, Any], ctx: ToolContext, timeout: float | None = None
    ) -> JSON:
        """Call the tool with validated arguments; the result must be JSON.
        A coroutine it returns is run on this thread's loop, and cancelled
        after ``timeout`` seconds (the rest of the step's time limit):
        :class:`~harness.errors.StepTimedOut`."""
        if self.context_param is not None:
            kwargs = {**kwargs, self.context_param: ctx}
        result = awaited(self.fn(**kwargs), timeout, f"tool {self.name!r}")
        if isinstance(result, Deferred | Sleep):  # recorded like a result (harness.waiting)
            return marker(result)
        try:
            refuse_marker(result, "result")
            # The tool-result door (harness.inputs): what no column or reader can
            # hold is the tool's error, recorded once, never a failing checkpoint.
            return checked_json(result, "result")
        except BadInput as err:
            raise ToolResultError(
                f"tool {self.name!r} returned a value that is not JSON-serialisable "
                f"({type(result).__name__}): {err.problem}; the call was made, "
                "but its result cannot be kept"
            ) from None


def awaited(value: Any, timeout: float | None, what: str) -> Any:
    """``value``, or what it resolves to if it is a coroutine (an ``async def``
    tool's call, or a plain function's that returns one), run on this
    thread's loop (harness.aio) and cancelled after ``timeout`` seconds."""
    if not asyncio.iscoroutine(value):
        return value
    try:
        return aio.run(value, timeout=timeout)
    except aio.TimedOut as late:
        raise StepTimedOut(
            f"{what} ran past the step's time limit: cancelled after {late.timeout:g} s"
        ) from None


def _argument_model(fn: Callable[..., Any], name: str) -> tuple[str | None, type[BaseModel]]:
    hints = get_type_hints(fn)
    context_param = None
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs are not supported")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {name!r}: positional-only {param.name!r} cannot be passed")
        annotation = hints.get(param.name, Any)
        if ToolContext in (annotation, *get_args(annotation)):
            context_param = param.name
            continue
        if param.name.startswith("_"):
            raise TypeError(f"tool {name!r}: parameter {param.name!r} cannot start with '_'")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(f"{name}_args", __config__=ConfigDict(extra="forbid"), **fields)
    return context_param, model


@overload
def tool(fn: Callable[..., Any], /) -> ToolSpec: ...


@overload
def tool(
    *,
    effect: str | ToolEffect = ...,
    name: str | None = ...,
    description: str | None = ...,
    reconcile: Reconcile | None = ...,
    requires_approval: bool = ...,
) -> Callable[[Callable[..., Any]], ToolSpec]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    effect: str | ToolEffect = ToolEffect.IDEMPOTENT,
    name: str | None = None,
    description: str | None = None,
    reconcile: Reconcile | None = None,
    requires_approval: bool = False,
) -> ToolSpec | Callable[[Callable[..., Any]], ToolSpec]:
    """Make a function a harness tool. Usable bare or with arguments::

    @harness.tool(effect="at_most_once", reconcile=was_sent)
    def send_email(to: str, body: str, ctx: harness.ToolContext) -> dict: ...

    ``reconcile(ctx)`` is optional: after a crash it tells whether the
    interrupted call of an ``at_most_once`` tool happened.
    ``requires_approval``: before each call the run waits for an operator's
    ``harness approve`` (perhaps with edited arguments) or ``harness reject``.
    The function (and ``reconcile``) may be ``async def``: awaited on the
    worker thread's event loop, and cancelled at the step's time limit.
    """
    try:
        tool_effect = ToolEffect(effect)
    except ValueError:
        choices = ", ".join(e.value for e in ToolEffect)
        raise ValueError(f"effect must be one of {choices}, not {effect!r}") from None

    def wrap(f: Callable[..., Any]) -> ToolSpec:
        doc = inspect.getdoc(f) or ""
        return ToolSpec(
            f, name or f.__name__, tool_effect, description or doc, reconcile, requires_approval
        )

    return wrap if fn is None else wrap(fn)


#: The names every provider takes for a tool.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_tool_name(name: str) -> None:
    """ValueError unless every provider takes ``name`` for a tool
    (OpenAI's and Anthropic's rule: ``^[a-zA-Z0-9_-]{1,64}$``)."""
    if not _TOOL_NAME.fullmatch(name):
        raise ValueError(f"name {name[:80]!r}: 1 to 64 letters, digits, '_' or '-'")


def agent_tool(
    agent: object, *, name: str | None = None, description: str | None = None
) -> ToolSpec:
    """A tool that hands a task to another agent: a call starts a run of
    ``agent`` (an Agent or its name) with the model's ``task`` as its goal,
    under the id ``{run_id}:{step_index}`` (never a second one, whatever
    crashes), and the call's result is that run's final answer, or its
    failure, once it ends. The caller's step waits without holding a worker;
    several such calls of one model turn run in parallel."""
    agent_name = agent if isinstance(agent, str) else getattr(agent, "name", None)
    if not isinstance(agent_name, str):
        raise TypeError(f"agent_tool takes an Agent or an agent's name, not {agent!r}")
    tool_name = name or re.sub(r"[^A-Za-z0-9_-]", "_", agent_name)[:64]
    check_tool_name(tool_name)

    def delegate(task: str, ctx: ToolContext) -> Deferred:
        return ctx.start_child(agent_name, task)

    about = description or (
        f"Hand a task to the agent {agent_name!r}, in words it can act on alone; "
        "its final answer comes back as the result."
    )
    return ToolSpec(delegate, tool_name, ToolEffect.IDEMPOTENT, about)


def sleep_tool(*, max_seconds: float, name: str = "sleep") -> ToolSpec:
    """A tool that lets the model wait: ``seconds`` (at most ``max_seconds``)
    later the call returns ``{"slept": seconds}``. No worker is held meanwhile."""
    limit = Sleep(max_seconds).seconds

    def sleep(seconds: float) -> Sleep:
        if seconds > limit:
            raise ValueError(f"at most {limit:g} seconds, not {seconds:g}")
        return Sleep(seconds)

    about = f"Wait this many seconds (0 to {limit:g}) before going on; nothing runs meanwhile."
    return ToolSpec(sleep, name, ToolEffect.READ_ONLY, about)
