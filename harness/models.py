"""Models: what decides the next turn of an agent.

A model step asks the model for one turn: either a final answer or a list of
tool calls. :class:`ScriptedModel` is deterministic (demos, tests); provider
models implement the same :class:`Model` protocol, and their turns carry
what providers report beside it: text next to the tool calls, each call's
id, token usage and the stop reason. A provider failure says whether it is
worth retrying (:class:`RetryableModelError`) or not (:class:`ModelError`).
A model's ``next_turn`` may be an ``async def`` (:class:`AsyncModel`): it is
run on the worker thread's event loop (harness.aio) by :func:`take_turn`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from harness import aio
from harness.errors import BadInput, ModelError, RetryableModelError
from harness.inputs import checked_json, render_json
from harness.records import JSON, Step

if TYPE_CHECKING:
    from pydantic import BaseModel

    from harness.tools import ToolSpec


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``id`` is the provider's, to answer it by.
    ``raw_arguments``: the arguments as sent, when they were not a JSON object
    (the call is answered with an error the model can react to)."""

    name: str
    args: dict[str, JSON] = field(default_factory=dict)
    id: str | None = None
    raw_arguments: str | None = None

    def __post_init__(self) -> None:
        # The model-arguments door (harness.inputs): arguments that no column or
        # reader can hold (NaN, too deep) are kept as the text the model sent,
        # and the call is answered with an error instead of being made.
        if self.raw_arguments is not None:
            return
        try:
            args = checked_json(self.args, "arguments")
        except BadInput:
            try:
                raw = json.dumps(self.args)  # NaN as the model wrote it
            except (TypeError, ValueError, RecursionError):
                raw = render_json(self.args)
            object.__setattr__(self, "args", {})
            object.__setattr__(self, "raw_arguments", raw)
            return
        if args is not self.args:  # lone surrogates replaced
            object.__setattr__(self, "args", args)

    def to_dict(self) -> dict[str, JSON]:
        call: dict[str, JSON] = {"name": self.name, "args": self.args}
        if self.id is not None:
            call["id"] = self.id
        if self.raw_arguments is not None:
            call["raw_arguments"] = self.raw_arguments
        return call


#: The most tokens one count may say: a run's token columns are 32-bit integers.
MAX_TOKENS = 2**31 - 1


def token_count(name: str, raw: Any) -> int:
    """A provider's token count as an integer; a value that is no count (NaN,
    a fraction, text) is the provider's error, named, on one line."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw:
        raise ModelError(f"the provider reported {name} = {raw!r}, not a token count")
    if isinstance(raw, float) and not raw.is_integer():
        raise ModelError(f"the provider reported {name} = {raw!r}, not a whole number")
    return int(raw)


@dataclass(frozen=True)
class Usage:
    """Tokens a provider reported for one turn. ``input_tokens`` are all its
    input tokens, cached or not. ``details``: the provider's other counts where
    it sends them (cached input tokens, cache writes), under the provider's own
    names. ``estimated``: the provider reported none; these are what was
    reserved for the turn, charged instead of nothing."""

    input_tokens: int = 0
    output_tokens: int = 0
    details: Mapping[str, int] = field(default_factory=dict)
    estimated: bool = False

    def __post_init__(self) -> None:
        # A provider's counts are a door: a run's token columns are 32-bit integers.
        counts = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        for name, value in {**counts, **self.details}.items():
            if not 0 <= value <= MAX_TOKENS:
                # Never str() a huge integer: past 4,300 digits that raises itself.
                big = isinstance(value, int) and abs(value) >= 10**30
                shown = f"about 2**{value.bit_length()}" if big else f"{value!r}"
                raise ModelError(f"the provider reported {name} = {shown}, outside 0..{MAX_TOKENS}")

    def to_dict(self) -> dict[str, JSON]:
        usage: dict[str, JSON] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            **self.details,
        }
        if self.estimated:
            usage["estimated"] = True
        return usage

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Usage:
        details = {
            k: int(v)
            for k, v in raw.items()
            if k not in _USAGE_FIELDS and isinstance(v, int) and not isinstance(v, bool)
        }
        return cls(
            int(raw.get("input_tokens", 0)),
            int(raw.get("output_tokens", 0)),
            details,
            estimated=raw.get("estimated") is True,
        )


_USAGE_FIELDS = ("input_tokens", "output_tokens", "estimated")


@dataclass(frozen=True)
class ModelTurn:
    """A final answer, or tool calls to make before the next turn.

    ``final``: text, or a JSON object (a structured answer: the input of the
    final-answer tool, or a scripted ``{"final": {...}}``).
    ``text``: what the model said beside its tool calls; ``usage`` and
    ``stop_reason``: as the provider reported them (None for a scripted turn).
    ``native``: the response in its framework's own JSON form, kept whole so
    that a re-run of that framework's agent gets back exactly what the model
    said (harness.pydantic_agents); such a turn may have neither ``final`` nor
    tool calls: the framework asks the model again (an answer it refused).
    """

    final: str | dict[str, JSON] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    text: str | None = None
    usage: Usage | None = None
    stop_reason: str | None = None
    native: dict[str, JSON] | None = None

    def to_result(self) -> dict[str, JSON]:
        """The model step's stored result: ``{"final": ...}`` or ``{"tool_calls": [...]}``,
        with ``text``, ``usage`` and ``stop_reason`` where there are any."""
        result: dict[str, JSON]
        if self.final is not None:
            result = {"final": self.final}
        else:
            result = {"tool_calls": [c.to_dict() for c in self.tool_calls]}
        if self.text is not None:
            result["text"] = self.text
        if self.usage is not None:
            result["usage"] = self.usage.to_dict()
        if self.stop_reason is not None:
            result["stop_reason"] = self.stop_reason
        if self.native is not None:
            result["native"] = self.native
        return result

    @classmethod
    def from_result(cls, raw: Mapping[str, Any]) -> ModelTurn:
        """The turn a model step stored (:meth:`to_result`), as recorded."""
        native = raw.get("native")
        if native is not None and "final" not in raw and not raw.get("tool_calls"):
            parsed = cls()  # a framework's turn that asks the model again
        else:
            parsed = cls.parse(raw)
        usage = raw.get("usage")
        calls = tuple(
            ToolCall(c.name, c.args, c.id, call.get("raw_arguments"))
            for c, call in zip(parsed.tool_calls, raw.get("tool_calls") or (), strict=True)
        )
        return cls(
            final=parsed.final,
            tool_calls=calls,
            text=raw.get("text"),
            usage=None if usage is None else Usage.from_dict(usage),
            stop_reason=raw.get("stop_reason"),
            native=native,
        )

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ModelTurn:
        """``{"final": "text"}``, ``{"final": {...}}`` (a JSON object: a
        structured answer) or ``{"tool_calls": [{"name": ..., "args": {...}}]}``."""
        if not isinstance(raw, Mapping):
            raise ModelError(f"a turn must be a mapping, not {type(raw).__name__}")
        if "final" in raw:
            final = raw["final"]
            if isinstance(final, Mapping):
                try:
                    final = checked_json(dict(final), "final")
                except BadInput as err:
                    raise ModelError(f"'final' is not storable JSON: {err.problem}") from None
            elif not isinstance(final, str):
                raise ModelError(f"'final' must be text or a JSON object, not {final!r}")
            if raw.get("tool_calls"):
                raise ModelError("a turn has either 'final' or 'tool_calls', not both")
            return cls(final=final)
        calls = raw.get("tool_calls")
        if not isinstance(calls, Sequence) or isinstance(calls, str) or not calls:
            raise ModelError(f"a turn needs 'final' or a non-empty 'tool_calls' list: {raw!r}")
        parsed = []
        for call in calls:
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                raise ModelError(f"a tool call needs a 'name': {call!r}")
            args = call.get("args", {})
            if not isinstance(args, Mapping):
                raise ModelError(f"tool call args must be a mapping: {call!r}")
            call_id = call.get("id")
            parsed.append(
                ToolCall(call["name"], dict(args), None if call_id is None else str(call_id))
            )
        return cls(tool_calls=tuple(parsed))


class Admission(Protocol):
    """A rate limit's answer to one request (harness.providers.ratelimit.Grant):
    ``wait`` 0.0 when admitted, ``bucket`` the sub-bucket its tokens were counted in."""

    @property
    def wait(self) -> float: ...
    @property
    def reserved_tokens(self) -> int: ...
    @property
    def bucket(self) -> int | None: ...


class RateLimits(Protocol):
    """The shared provider rate limits a model turn is admitted by
    (harness.providers.ratelimit.RateLimiter). Declared here, where the request
    carries them, so that this module, which every provider imports, imports
    no provider."""

    def acquire(
        self, provider: str, model: str, tokens: int, ticket: str | None = None
    ) -> Admission: ...
    def withdraw(self, provider: str, model: str, ticket: str) -> None: ...
    def settle(
        self, provider: str, model: str, reserved: int, used: int, bucket: int | None = None
    ) -> None: ...


@dataclass(frozen=True)
class ModelRequest:
    """What a model gets for one turn. ``history()`` reads the steps so far
    from the store; call it only if the model needs the conversation.
    ``tools``: the agent's tools, to offer. ``limiter``: the shared provider
    rate limits (None: none configured). ``timeout``: seconds the call may
    take at most (the step's time limit, or the model's own if shorter).
    ``bounded``: the run has a token or cost budget, so the request must carry
    the output limit its reservation counted (a reply then cannot take more
    than was reserved for it). ``output_type``: the agent's (a pydantic model
    class): the final answer is wanted as a JSON object that validates
    against it (harness.output says how each provider is asked).
    ``on_text``: called with each piece of the answer's text as the provider
    streams it, in order; what it raises is logged and the call goes on (the
    recorded turn is the whole response either way, and a retried call
    streams its text again from the start). ``exchanges``: the conversation
    before the turn as exchanges (harness.providers.transcript), made of what
    ``history()`` reads, for a provider model; None: made from ``history()``."""

    run_id: str
    goal: str
    turn: int
    step_index: int
    history: Callable[[], list[Step]]
    tools: Sequence[ToolSpec] = ()
    limiter: RateLimits | None = None
    timeout: float | None = None
    bounded: bool = False
    output_type: type[BaseModel] | None = None
    on_text: Callable[[str], None] | None = None
    #: Each a harness.providers.transcript.Exchange (not named here: the
    #: providers import this module).
    exchanges: Callable[[], list[Any]] | None = None
    #: For a model with ``records_early`` set: the step's record of its
    #: response (:class:`ResponseRecorder`), to keep the response the moment
    #: it arrives, before the model's own code runs on it.
    recorder: ResponseRecorder | None = None


class ResponseRecorder(Protocol):
    """A model step's record of its paid response, for a model that does more
    with a response than return it (a framework's agent validates it, runs
    its output functions, ...): the response is recorded before that runs, so
    that code that is slow, killed or raising never buys it again."""

    def recorded(self) -> tuple[bool, JSON]:
        """``(True, result)`` if the step's response is recorded (the result
        :meth:`keep` was given); else the step holds its key until
        :meth:`keep` or :meth:`release`."""

    def keep(self, result: dict[str, JSON], usage: Usage | None) -> JSON:
        """Record ``result`` with its ``usage`` (and price) and return what
        is recorded (first writer wins)."""

    def release(self) -> None:
        """No response to keep (the call failed or was stopped)."""


class Model(Protocol):
    def next_turn(self, request: ModelRequest) -> ModelTurn:
        """Decide the next turn. Must not have side effects: it may be re-run.

        Raise :class:`~harness.errors.RetryableModelError` for a transient
        failure (the step is retried later, durably) or
        :class:`~harness.errors.ModelError` for a permanent one (the run fails).
        A model with a ``records_responses`` attribute set to False (a
        deterministic one) is not recorded before its checkpoint; every other
        model's response is, so that a crash never calls (and bills) it twice.
        A model may also have ``reserve(request) -> Usage``: the most the call
        may use, checked against the run's budgets before it is made.
        """


class AsyncModel(Protocol):
    """A :class:`Model` whose ``next_turn`` is a coroutine function; the same
    contract, awaited on the worker thread's loop. A call longer than the
    request's ``timeout`` is cancelled (the coroutine sees ``CancelledError``)
    and is a :class:`~harness.errors.RetryableModelError`, as a provider's
    timeout is."""

    async def next_turn(self, request: ModelRequest) -> ModelTurn: ...


def take_turn(model: Model | AsyncModel, request: ModelRequest) -> ModelTurn:
    """``model``'s turn for ``request``, awaited on this thread's loop if its
    ``next_turn`` is a coroutine function (or returned a coroutine)."""
    turn: Any = model.next_turn(request)
    if not asyncio.iscoroutine(turn):
        return turn  # type: ignore[no-any-return]
    try:
        turn = aio.run(turn, timeout=request.timeout)
    except aio.TimedOut as late:
        raise RetryableModelError(f"the model's call timed out after {late.timeout:g} s") from None
    if not isinstance(turn, ModelTurn):
        raise ModelError(f"next_turn returned {type(turn).__name__}, not a ModelTurn")
    return turn


#: A word and the space after it: the pieces a scripted answer is streamed in.
_WORDS = re.compile(r"\s*\S+\s*|\s+")


class ScriptedModel:
    """Turn *i* answers model step *i*: deterministic, for demos and tests."""

    #: Free and deterministic: calling it again costs nothing, so its turns are
    #: not recorded ahead of the step's checkpoint.
    records_responses = False

    def __init__(self, turns: Sequence[Mapping[str, Any]]) -> None:
        self.turns = tuple(ModelTurn.parse(t) for t in turns)

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        if request.turn >= len(self.turns):
            raise ModelError(
                f"ScriptedModel has {len(self.turns)} turns; turn {request.turn} was asked for"
            )
        turn = self.turns[request.turn]
        if request.on_text is not None:
            # Written a word at a time, as a provider streams it (harness.streams).
            for text in (turn.text, turn.final):
                if isinstance(text, str):
                    for word in _WORDS.findall(text):
                        request.on_text(word)
        return turn
