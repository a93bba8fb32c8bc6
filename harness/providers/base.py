"""What every provider model shares: the request's parts, rate limits, and
which failures are worth retrying.

A provider model is a :class:`~harness.models.Model`. For one turn it

1. rebuilds the conversation from the stored steps (harness.providers.transcript)
   and describes the agent's tools from their type hints and docstrings;
2. takes room in the provider's shared rate limit, if one is configured; with
   none left it raises :class:`~harness.errors.Throttled` and the step is
   rescheduled, durably, for when there will be;
3. calls the SDK once, streamed, with the SDK's own retries off
   (``max_retries=0``): retrying is the harness's job, with the attempt count
   and the wake-up in SQL, so a retry survives a crash and frees the worker
   while it waits; the whole call, not just each read, ends by its timeout
   (:mod:`harness.providers.deadline`). The SDK sends the request and raises
   its status errors; the body it hands back unread (its
   ``with_streaming_response``) is read here, each event a plain dict
   (:mod:`harness.providers.sse`: the SDKs' typed events cost more CPU than
   the rest of a model step);
4. assembles the streamed events into the turn the unstreamed response would
   have been (its text, its tool calls and their arguments, its usage, its
   stop reason), handing each piece of text to the request's ``on_text`` as
   it arrives; only a stream that reached its end makes a turn;
5. maps a failure to :class:`~harness.errors.RetryableModelError` (429, 408,
   409, 5xx, 529, a timeout, a dropped connection, a stream cut or ended
   early or garbled, an overload or server error the stream reports; with the
   provider's ``retry-after``) or :class:`~harness.errors.ModelError` (400,
   401, 403, 404, 422, a context too long, a 429 for a spent quota: the run
   fails with the provider's message).

Streaming is the one path: a turn is paid, recorded and billed once as
before, whole; the deltas are only a view of it while it is written.

An agent with an ``output_type`` (harness.output) has its final answer asked
for with the provider's structured output; a call of the final-answer tool
is its final answer (:func:`answered_by_tool`, on the assembled turn).
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import inspect
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any, ClassVar

from harness.errors import ConfigError, ModelError, RetryableModelError, Throttled
from harness.models import ModelRequest, ModelTurn, ToolCall, Usage
from harness.output import FINAL_TOOL, OutputSchema, output_schema
from harness.providers.deadline import deadline, http_library
from harness.providers.sse import misshapen, unread
from harness.providers.transcript import Exchange, exchanges
from harness.records import JSON, idempotency_key
from harness.tools import ToolSpec

log = logging.getLogger(__name__)

#: A call may take this long at most, unless the model says otherwise
#: (``timeout=``) or the step's time limit is shorter.
DEFAULT_TIMEOUT = 600.0
#: Output tokens reserved for a request that sets no limit of its own: by the
#: budgets (which then send it as the request's limit) and by the token rate limit.
DEFAULT_OUTPUT_RESERVE = 1024
#: Codes of a 429 that no wait cures (a quota spent, not a rate exceeded): the
#: run fails at once with the provider's message instead of retrying.
PERMANENT_429 = frozenset({"insufficient_quota"})
#: Characters per token, roughly, to reserve room in a token rate limit
#: before the provider says how many the request really used.
CHARS_PER_TOKEN = 4
#: Error types a stream may report once it has begun that a later attempt may
#: not meet (Anthropic's and OpenAI's words): retried, like their HTTP statuses.
TRANSIENT_STREAM_ERRORS = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error", "server_error"}
)


def tool_schema(spec: ToolSpec) -> dict[str, JSON]:
    """The JSON schema of a tool's arguments (:meth:`ToolSpec.schema`)."""
    return spec.schema()


#: Held while an SDK client is made; made anew in a forked child, which could
#: otherwise inherit it held by a thread that does not exist there.
_client_lock = threading.Lock()


def _new_client_lock() -> None:
    global _client_lock
    _client_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_client_lock)


class ProviderModel:
    """A model behind a provider's API. Subclasses say how to build the SDK
    client, format a request, assemble a turn from its streamed reply, and
    recognise the SDK's errors."""

    provider: ClassVar[str]
    extra: ClassVar[str]  # the optional dependency that brings the SDK
    #: The request field of the reply's output limit, sent when a budget needs one.
    output_limit: ClassVar[str] = "max_tokens"
    #: Request fields sent as built, in ``extra_body``, not as the SDK method's
    #: arguments: the SDK walks an argument against its declared types, every
    #: message and tool of the conversation each call, to rename aliased keys
    #: and format dates and files, which these fields have none of (a unit test
    #: checks it, on the SDK installed). That walk was 3 ms of CPU a call here,
    #: more than everything else a model step costs the harness.
    verbatim: ClassVar[tuple[str, ...]] = ("messages", "tools")

    def __init__(
        self,
        model: str,
        *,
        system: str | None = None,
        timeout: float | None = None,
        **params: Any,
    ) -> None:
        self.model = model
        self.system = system
        self.timeout = timeout
        self.params = params
        self.sdk = self._import_sdk()
        self._client: Any = None
        self._client_pid = 0

    @property
    def name(self) -> str:
        """``provider:model``: how prices and rate limits name it."""
        return f"{self.provider}:{self.model}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.model}>"

    @classmethod
    def _import_sdk(cls) -> Any:
        raise NotImplementedError

    @classmethod
    def _missing_extra(cls, err: ImportError) -> ConfigError:
        return ConfigError(
            f"{cls.__name__} needs the {cls.extra!r} extra: "
            f"pip install -e '.[{cls.extra}]' in the harness's clone ({err})"
        )

    def client(self) -> Any:
        """The SDK client of this process, made on first use (after a fork, anew:
        an HTTP connection pool must not be shared across processes), once for
        all the threads of a threads pool. It reads the SDK's own environment
        variables."""
        pid = os.getpid()
        if self._client is not None and self._client_pid == pid:
            return self._client
        with _client_lock:
            if self._client is None or self._client_pid != pid:
                try:
                    self._client = self._make_client()
                except self._base_error() as err:
                    raise ModelError(f"{self.name}: cannot make the client: {err}") from None
                self._client_pid = pid
                # Its connections are kept between calls: closed with the model, not
                # left to the garbage collector (a model made and dropped, in a test).
                weakref.finalize(self, _close_quietly, self._client)
            return self._client

    def _make_client(self) -> Any:
        raise NotImplementedError

    def _base_error(self) -> type[Exception]:
        raise NotImplementedError

    # One turn -------------------------------------------------------------

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        payload = self._payload(request)
        # The request's estimate (its length: linear in the conversation) is made
        # only if something counts it: the rate limit, or a reply with no usage.
        estimate = functools.cache(lambda: self._estimate(payload))
        timeout = min(self.timeout or DEFAULT_TIMEOUT, request.timeout or DEFAULT_TIMEOUT)
        # The client is made (on a process's first call: tens of milliseconds, more on a
        # busy machine) before the admission: the limiter allows for a request's trip to
        # the provider, not for that.
        method, known = self._prepare(payload)
        reserved, bucket = 0, None
        if request.limiter is not None:
            limiter, ticket = request.limiter, idempotency_key(request.run_id, request.step_index)
            tokens = estimate().input_tokens + estimate().output_tokens
            grant = limiter.acquire(self.provider, self.model, tokens, ticket=ticket)
            if grant.wait > 0:
                withdraw = functools.partial(limiter.withdraw, self.provider, self.model, ticket)
                raise Throttled(f"rate limit of {self.name} reached", grant.wait, withdraw)
            reserved, bucket = grant.reserved_tokens, grant.bucket
        turn = self._send(method, known, timeout, request.on_text)
        if request.output_type is not None:
            turn = answered_by_tool(turn)
        if turn.usage is None:
            # Unknown is not free: the turn is charged what was reserved for it, said so.
            return replace(turn, usage=replace(estimate(), estimated=True))
        # Settled only from reported usage: a call that failed, or a server that
        # reports none, keeps its reservation (it may have been counted upstream).
        if request.limiter is not None:
            used = turn.usage.input_tokens + turn.usage.output_tokens
            if used != reserved:
                request.limiter.settle(self.provider, self.model, reserved, used, bucket)
        return turn

    def reserve(self, request: ModelRequest) -> Usage:
        """The most this turn may use, for the run's budgets; the same as the
        rate limit counts before the call (:meth:`_estimate`)."""
        return self._estimate(self._payload(request))

    def _payload(self, request: ModelRequest) -> dict[str, Any]:
        """The turn's request; a bounded one (the run has a budget) carries the
        output limit that its reservation counts, if the model sets none."""
        if request.exchanges is not None:
            history = request.exchanges()
        else:
            history = exchanges(request.history(), request.step_index)
        output = None if request.output_type is None else output_schema(request.output_type)
        payload = self.payload(request.goal, history, list(request.tools), output)
        if request.bounded and not self.max_output_tokens():
            payload[self.output_limit] = DEFAULT_OUTPUT_RESERVE
        return payload

    def _estimate(self, payload: dict[str, Any]) -> Usage:
        """The most a request may use: its input, estimated from its length, and
        its output limit (``max_tokens``; :data:`DEFAULT_OUTPUT_RESERVE` when it
        sets none). Both the budgets and the token rate limit reserve this."""
        output = self.max_output_tokens() or DEFAULT_OUTPUT_RESERVE
        return Usage(len(str(payload)) // CHARS_PER_TOKEN, output)

    def _prepare(self, payload: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The SDK method of a turn and its keyword arguments."""
        method = self.endpoint(self.client())
        known, unknown = _split(method, payload)
        verbatim = {k: known.pop(k) for k in self.verbatim if k in known}
        if unknown or verbatim:
            # Fields this SDK does not know (a newer API's, a compatible
            # server's own), and the bulky ones (:attr:`verbatim`): sent as
            # they are, the SDKs' way.
            known["extra_body"] = {**known.get("extra_body", {}), **unknown, **verbatim}
        if "messages" in verbatim:
            known["messages"] = []  # required by the method; the body's comes from extra_body
        # Not in the payload: what a request is estimated at does not change with it.
        return method, {**known, **self.streaming(known)}

    def _send(
        self,
        method: Callable[..., Any],
        known: dict[str, Any],
        timeout: float,
        on_text: Callable[[str], None] | None,
    ) -> ModelTurn:
        started = time.monotonic()
        opened = False
        try:
            # ``timeout`` bounds each read; the deadline, the whole call (a trickle too),
            # the reading of the stream included.
            with deadline(timeout), unread(method)(**known, timeout=timeout) as response:
                opened = True
                return self._read(response, Deltas(on_text, self.name))
        except _failures(self.sdk, self._base_error()) as err:
            elapsed = time.monotonic() - started
            raise self.classify(err, timeout, elapsed, streaming=opened) from None

    def _read(self, response: Any, deltas: Deltas) -> ModelTurn:
        """The turn out of the SDK's unread response."""
        try:
            return self.assemble(self.events(response), deltas)
        except (AttributeError, TypeError) as err:  # a field of a type its API does not send
            raise misshapen(self.name, err) from err

    def max_output_tokens(self) -> int:
        """The most tokens a reply may take, as the model was given it; 0: no limit."""
        return int(self.params.get("max_tokens") or self.params.get("max_completion_tokens") or 0)

    # What subclasses provide ----------------------------------------------

    def payload(
        self,
        goal: str,
        history: Sequence[Exchange],
        tools: Sequence[ToolSpec],
        output: OutputSchema | None = None,
    ) -> dict[str, Any]:
        """The request; ``output``: the structured final answer wanted, if any."""
        raise NotImplementedError

    def endpoint(self, client: Any) -> Callable[..., Any]:
        """The SDK method that makes one turn."""
        raise NotImplementedError

    def streaming(self, known: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments that make the endpoint stream its reply."""
        return {"stream": True}

    def events(self, response: Any) -> Iterator[dict[str, Any]]:
        """The events of the SDK's unread streamed response, each the JSON
        object its data says; an error the stream reports raised as the SDK
        raises it (an ``APIError``)."""
        raise NotImplementedError

    def assemble(self, events: Iterable[Any], deltas: Deltas) -> ModelTurn:
        """The turn out of the stream's events (:meth:`events`; an SDK's typed
        event is read as its dict), each piece of text given to ``deltas`` as
        it comes; :meth:`unfinished` if the stream stops short."""
        raise NotImplementedError

    def unfinished(self) -> RetryableModelError:
        """A stream that ended without its end (the connection closed cleanly midway):
        no turn, retried like a dropped connection."""
        return RetryableModelError(f"{self.name}: the stream ended before the response did")

    # Failures ---------------------------------------------------------------

    def classify(
        self, err: Exception, timeout: float, elapsed: float, *, streaming: bool = False
    ) -> ModelError:
        """A transient failure, to retry, or a permanent one, to fail the run with.
        ``streaming``: it came after the stream began."""
        sdk = self.sdk
        timeouts, transports = _transport_errors(sdk)
        if isinstance(err, (sdk.APITimeoutError, *timeouts)):
            return RetryableModelError(f"{self.name}: no response within {timeout:g}s (timeout)")
        if isinstance(err, (sdk.APIConnectionError, *transports)):
            what = "the stream was cut" if streaming else "connection failed"
            return RetryableModelError(f"{self.name}: {what} after {elapsed:.1f}s: {err}")
        if isinstance(err, sdk.APIError) and (
            not isinstance(err, sdk.APIStatusError) or err.status_code < 400
        ):
            # An error event in a stream under way (its response said 200).
            kind = _code(err)
            failed = RetryableModelError if kind in TRANSIENT_STREAM_ERRORS else ModelError
            return failed(f"{self.name}: the stream reported {kind or 'an error'}: {_message(err)}")
        if isinstance(err, sdk.APIStatusError):
            status = err.status_code
            message = _message(err)
            if status == 429 and _code(err) in PERMANENT_429:
                return ModelError(f"{self.name} refused the request (HTTP 429): {message}")
            if status in (408, 409, 429) or status >= 500:
                return RetryableModelError(
                    f"{self.name}: HTTP {status}: {message}",
                    retry_after=retry_after(err.response.headers),
                )
            return ModelError(f"{self.name} rejected the request (HTTP {status}): {message}")
        return ModelError(f"{self.name}: {type(err).__name__}: {err}")


def _close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.close()


def answered_by_tool(turn: ModelTurn) -> ModelTurn:
    """A turn that called the final-answer tool (:data:`FINAL_TOOL`) as the
    final answer it is: the tool's input (its text, if it was no object).
    Other calls of the same turn are not made: the answer ends the run, as
    an answer in text would."""
    call = next((c for c in turn.tool_calls if c.name == FINAL_TOOL), None)
    if call is None:
        return turn
    final = call.args if call.raw_arguments is None else call.raw_arguments
    return ModelTurn(final=final, text=turn.text, usage=turn.usage, stop_reason=turn.stop_reason)


class Deltas:
    """A request's ``on_text``, guarded: what it raises is logged (once a call,
    with its traceback) and the call goes on; the turn never depends on it."""

    def __init__(self, hook: Callable[[str], None] | None, name: str) -> None:
        self._hook = hook
        self._name = name
        self.failures = 0

    def __call__(self, text: str) -> None:
        if self._hook is None or not text:
            return
        try:
            self._hook(text)
        except Exception:
            self.failures += 1
            if self.failures == 1:
                log.warning(
                    "%s: the text-delta hook failed; the call goes on", self._name, exc_info=True
                )


def tool_call(name: str, raw: str, call_id: str | None) -> ToolCall:
    """A call whose arguments came as JSON text: the object they say, or, when
    they are not a JSON object, none and the text kept as it came."""
    raw = raw or "{}"
    try:
        args = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, too deep, a 5,000-digit number
        args = None
    if not isinstance(args, dict):
        return ToolCall(name, {}, call_id, raw_arguments=raw)
    return ToolCall(name, args, call_id)


@functools.cache
def _transport_errors(
    sdk: ModuleType,
) -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """The timeouts and the other failures of a request of the SDK's HTTP
    library (a read that failed, a body that does not decode): raised as they
    are by the reads of a stream, which the SDK hands back unread."""
    library = http_library(sdk)
    if library is None:
        return (), ()
    return (library.TimeoutException,), (library.RequestError,)


def _failures(sdk: ModuleType, base: type[Exception]) -> tuple[type[Exception], ...]:
    timeouts, transports = _transport_errors(sdk)
    return (base, *timeouts, *transports)


@functools.cache
def _parameters(function: Callable[..., Any]) -> frozenset[str]:
    """The parameter names of an SDK method (read once: ``inspect.signature``
    costs a tenth of a millisecond, every call)."""
    return frozenset(inspect.signature(function).parameters)


def _split(
    method: Callable[..., Any], payload: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The payload's fields the SDK method takes, and the others."""
    accepted = _parameters(getattr(method, "__func__", method))
    known = {k: v for k, v in payload.items() if k in accepted}
    return known, {k: v for k, v in payload.items() if k not in accepted}


def _code(err: Any) -> str | None:
    """The error's code (or, failing that, its type) in the provider's error body."""
    body = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(inner, Mapping):
        return None
    code = inner.get("code") or inner.get("type")
    return code if isinstance(code, str) else None


def _message(err: Any) -> str:
    """The provider's own words, out of its error body."""
    body = getattr(err, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return str(getattr(err, "message", err))


def retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """The provider's hint, in seconds: ``retry-after-ms``, or ``retry-after``
    as seconds or as an HTTP date. None when absent or unreadable."""
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - now())
    except (TypeError, ValueError, OverflowError):
        return None
