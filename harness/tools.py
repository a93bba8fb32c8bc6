"""Tools: the ``@harness.tool`` decorator, argument validation and effects.

A tool declares its effect, which decides what happens when a crash leaves
its step RUNNING and nobody knows whether the call went out:

* ``read_only``: no effect on the world; simply called again.
* ``idempotent``: safe to repeat with the same idempotency key; called again
  with the key of the first attempt, which the tool should pass downstream.
* ``at_most_once``: never repeated while in doubt; the step becomes
  ``in_doubt`` and the run waits for an operator.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, get_args, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from harness.errors import BadInput, InvalidToolArgs, ToolResultError
from harness.inputs import checked_json
from harness.records import JSON, idempotency_key


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
    """What a tool may know about the step calling it."""

    run_id: str
    step_index: int
    attempt: int

    @property
    def idempotency_key(self) -> str:
        """``"{run_id}:{step_index}"``: the same on every attempt of this step."""
        return idempotency_key(self.run_id, self.step_index)


#: Asked after a crash whether an at_most_once call happened: ``Happened(result)``,
#: ``NotHappened()``, or ``None`` when it cannot tell (the step stays in doubt).
Reconcile = Callable[[ToolContext], Happened | NotHappened | None]


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
        self.context_param, self.args_model = _argument_model(fn, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the plain function (tests, other code): no harness involved."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<tool {self.name} effect={self.effect.value}>"

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

    def invoke(self, kwargs: dict[str, Any], ctx: ToolContext) -> JSON:
        """Call the tool with validated arguments; the result must be JSON."""
        if self.context_param is not None:
            kwargs = {**kwargs, self.context_param: ctx}
        result = self.fn(**kwargs)
        try:
            # The tool-result door (harness.inputs): what no column or reader can
            # hold is the tool's error, recorded once, never a failing checkpoint.
            return checked_json(result, "result")
        except BadInput as err:
            raise ToolResultError(
                f"tool {self.name!r} returned a value that is not JSON-serialisable "
                f"({type(result).__name__}): {err.problem}; the call was made, "
                "but its result cannot be kept"
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
