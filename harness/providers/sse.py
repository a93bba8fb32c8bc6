"""A streamed reply's Server-Sent Events, read here rather than by the SDK.

The SDKs build a typed model of every event they read (openai's
``ChatCompletionChunk``, anthropic's ``RawMessageStreamEvent``): about a
quarter of a millisecond of CPU an event, and the APIs send about a token an
event, so a model step streamed cost several times the CPU of the same step
unstreamed (``python -m bench.streams``). The SDKs still
build and send the request, authenticate it and raise their status errors
before a stream starts (their ``with_streaming_response``); the events of the
body they hand back unread are split here into lines and fields, as the
Server-Sent Events specification says, and each one's data is decoded into a
plain dict that a provider assembles its turn from.

The reading is what a streamed step costs beyond an unstreamed one, so it is
kept lean (bench.streams): the body is taken as the HTTP layer gives it
(:func:`body`: undecoded when it came unencoded, as event streams do), its
lines stay bytes, and an event's data is decoded by ``msgspec`` straight from
its bytes (a fifth of ``json.loads``'s time on a typical chunk); what
``msgspec`` refuses is read again by ``json.loads``, so what parses, and what
a failure says, is ``json``'s.

What a server sends that is no event stream (bytes that are not UTF-8, data
that is not a JSON object) is a :class:`~harness.errors.RetryableModelError`
naming what came, as a garbled stream is: the step is retried.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec

from harness.errors import RetryableModelError
from harness.providers.deadline import deadline

#: How much of what did not parse a failure quotes.
QUOTED = 200
#: How long the end of a body may take to come after the event that ends its
#: stream (OpenAI's ``[DONE]``), in seconds; it comes at once from a real API.
DRAIN = 0.1


def unread(method: Callable[..., Any]) -> Callable[..., Any]:
    """The SDK method ``method`` answering with its HTTP response unread, in a
    context that closes it: the resource's ``with_streaming_response`` twin."""
    resource: Any = getattr(method, "__self__", None)
    twin: Callable[..., Any] = getattr(resource.with_streaming_response, method.__name__)
    return twin


def plain(event: Any) -> Mapping[str, Any]:
    """An event as the JSON object it came as: itself, or an SDK's typed
    event as its dict (the fields the server sent, under the API's names)."""
    if isinstance(event, dict):
        return event
    return event.to_dict()  # type: ignore[no-any-return]


def body(response: Any) -> Iterator[bytes]:
    """The bytes of an SDK's unread response as they come. Unencoded (no
    ``Content-Encoding``, as event streams come), its raw bytes, without the
    HTTP library's decoding and re-chunking of each piece; otherwise decoded."""
    http = getattr(response, "http_response", response)
    if http.headers.get("content-encoding", "identity") in ("", "identity"):
        return http.iter_raw()  # type: ignore[no-any-return]
    return response.iter_bytes()  # type: ignore[no-any-return]


def events(chunks: Iterable[bytes], source: str) -> Iterator[tuple[str | None, str]]:
    """Each event of the stream as its name (``event:``; None when unnamed) and
    its data (its ``data:`` lines, joined by newlines), as soon as the blank line
    ending it has come. Comments and the other fields (``id:``, ``retry:``) are
    skipped; so is an event with neither name nor data. ``source`` names the
    stream in a failure."""
    for name, data in raw_events(chunks, source):
        yield name, _text(data, source)


def raw_events(chunks: Iterable[bytes], source: str) -> Iterator[tuple[str | None, bytes]]:
    """:func:`events`, each one's data left as the bytes it came as (for
    :func:`loads`, which checks them)."""
    name: str | None = None
    data: list[bytes] = []
    for line in _lines(chunks):
        if not line:
            if name is not None or data:
                yield name, data[0] if len(data) == 1 else b"\n".join(data)
            name, data = None, []
            continue
        field, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = _text(value, source) or None


def loads(data: str | bytes, source: str) -> dict[str, Any]:
    """An event's data as the JSON object it must be."""
    try:
        value = _DECODER.decode(data)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        # Read again by json, whose reading is the rule (a number past 64 bits,
        # a lone surrogate), and whose failure is said.
        text = _text(data, source) if isinstance(data, bytes) else data
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            raise _garbled(source, "data that is not JSON", text) from None
    if not isinstance(value, dict):
        said = data.decode(errors="replace") if isinstance(data, bytes) else data
        raise _garbled(source, "data that is not a JSON object", said)
    return value


def drain(rest: Iterator[Any]) -> None:
    """Read what follows the event that ends a stream (the body's end, normally
    there already), for :data:`DRAIN` seconds at most: a body read to its end
    gives its connection back to the client's pool for the next call, where one
    left unread is closed (a new connection, and its TLS handshake, each call).
    What is read is not used, and a failure here is none of the call's: its
    turn is whole."""
    with contextlib.suppress(Exception), deadline(DRAIN):
        for _ in rest:
            pass


def misshapen(source: str, err: Exception) -> RetryableModelError:
    """An event whose JSON is not shaped as its API says (a list where an object
    belongs, a number for a text): read as a garbled stream is."""
    return RetryableModelError(f"{source}: the stream sent an event of an unexpected shape: {err}")


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of the body, without their ends: split at CRLF, LF or CR only,
    as the specification does (``str.splitlines`` would also split at U+2028,
    which a JSON string may hold as it is). A CR that ends a chunk is held, in
    case the LF of its CRLF begins the next one. A last line with no end is
    dropped: it is part of no event (none is complete without a blank line
    after it)."""
    pending = b""
    for chunk in chunks:
        data = pending + chunk if pending else chunk
        held = b""
        if b"\r" in data:
            if data.endswith(b"\r"):
                data, held = data[:-1], b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *complete, pending = data.split(b"\n")
        pending += held
        yield from complete
    if pending.endswith(b"\r"):  # its end came last: no LF will follow it
        yield pending[:-1]


_DECODER = msgspec.json.Decoder()


def _text(data: bytes, source: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise _garbled(source, "bytes that are not UTF-8", data) from None


def _garbled(source: str, what: str, came: str | bytes) -> RetryableModelError:
    quoted = came[:QUOTED]
    more = "..." if len(came) > QUOTED else ""
    return RetryableModelError(f"{source}: the stream sent {what}: {quoted!r}{more}")
