"""A streamed reply read by the harness (harness.providers.sse), not by the SDK.

The split of a body into Server-Sent Events, against the specification's
edge cases; then whole calls through the real SDKs to a local server that
sends a body as written here, byte for byte (tests.wire sends only what the
APIs send): an error event midway, fields and events the harness does not
know, data that is not JSON or not shaped as the API says, the body's end
after OpenAI's ``[DONE]`` read so that the connection is kept.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import harness
from harness.agents import register_agent
from harness.engine.creation import create_run
from harness.errors import ModelError, RetryableModelError
from harness.models import ModelRequest, Usage
from harness.providers import sse
from harness.providers.base import ProviderModel
from harness.records import RunStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig

# -- the events of a body -----------------------------------------------------------


def split(*chunks: bytes) -> list[tuple[str | None, str]]:
    return list(sse.events(iter(chunks), "m"))


def test_events_end_at_a_blank_line_whatever_the_line_ends() -> None:
    body = b"event: a\ndata: 1\n\nevent: b\r\ndata: 2\r\n\r\nevent: c\rdata: 3\r\r"
    assert split(body) == [("a", "1"), ("b", "2"), ("c", "3")]
    # The same bytes in every possible pair of chunks: a CRLF split across two
    # chunks is one line end, not two.
    for cut in range(len(body) + 1):
        assert split(body[:cut], body[cut:]) == [("a", "1"), ("b", "2"), ("c", "3")]


def test_data_lines_join_comments_and_other_fields_are_skipped() -> None:
    body = b": a comment\nid: 7\nretry: 10\ndata: one\ndata:two\nfoo: bar\n\ndata\n\n"
    assert split(body) == [(None, "one\ntwo"), (None, "")]


def test_an_event_with_no_blank_line_after_it_is_none() -> None:
    assert split(b"data: 1\n\ndata: 2\n") == [(None, "1")]
    assert split(b"\n\n\n") == []


def test_a_line_breaks_only_at_cr_or_lf() -> None:
    """U+2028 (and U+0085, U+000C...) may stand in a JSON string as they are:
    ``str.splitlines`` would break the event there."""
    text = "one\u2028two\u0085three\x0cfour é"
    data = json.dumps({"t": text}, ensure_ascii=False).encode()
    events = split(b"data: " + data[:9], data[9:] + b"\n\n")
    assert [json.loads(d)["t"] for _, d in events] == [text]


def test_a_character_split_across_chunks_is_whole() -> None:
    body = "data: é€😀\n\n".encode()
    for cut in range(len(body) + 1):
        assert split(body[:cut], body[cut:]) == [(None, "é€😀")]


def test_bytes_that_are_not_utf8_are_a_garbled_stream() -> None:
    with pytest.raises(RetryableModelError, match="m: the stream sent bytes that are not UTF-8"):
        split(b"data: \xff\xfe\n\n")


@pytest.mark.parametrize(
    ("data", "what"),
    [
        ("{oops", "data that is not JSON: '{oops'"),
        ("[" * 100_000, "data that is not JSON"),
        ('"text"', "data that is not a JSON object"),
        ("", "data that is not JSON"),
    ],
)
def test_data_must_be_a_json_object(data: str, what: str) -> None:
    with pytest.raises(RetryableModelError, match=f"m: the stream sent {what}"):
        sse.loads(data, "m")


def test_data_as_bytes_reads_as_json_reads_it() -> None:
    """The fast decoder refuses what json reads (a number past 64 bits, a lone
    surrogate): json's reading is the rule, and the bytes of a data line are
    checked as UTF-8 as a line of text is."""
    assert sse.loads(b'{"n": 123456789012345678901234567890}', "m") == {
        "n": 123456789012345678901234567890
    }
    assert sse.loads(b'{"t": "\\ud800"}', "m") == {"t": "\ud800"}
    assert sse.loads('{"t": "é"}'.encode(), "m") == {"t": "é"}
    with pytest.raises(RetryableModelError, match="m: the stream sent bytes that are not UTF-8"):
        sse.loads(b'{"t": "\xff"}', "m")
    with pytest.raises(RetryableModelError, match="m: the stream sent data that is not JSON"):
        sse.loads(b"NaN-ish", "m")
    with pytest.raises(RetryableModelError, match="not a JSON object: '\\[1\\]'"):
        sse.loads(b"[1]", "m")


def test_raw_events_keep_the_data_as_bytes() -> None:
    body = b"event: a\ndata: {}\ndata: 2\n\ndata: \xff\n\n"
    assert list(sse.raw_events(iter([body]), "m")) == [("a", b"{}\n2"), (None, b"\xff")]


def test_what_did_not_parse_is_quoted_short() -> None:
    with pytest.raises(RetryableModelError) as caught:
        sse.loads("x" * 10_000, "m")
    assert str(caught.value).endswith("'...") and len(str(caught.value)) < 300


# -- whole calls against bodies written here -------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up: expected
            super().handle_error(request, client_address)


class Canned:
    """A server answering every POST with the next of ``bodies`` (the last one
    again once they are spent), each a list of pieces sent as HTTP chunks, the
    body ended unless ``hold``: then it stays open until the server stops."""

    def __init__(self, bodies: Sequence[Sequence[bytes]], hold: bool = False) -> None:
        self.bodies = list(bodies)
        self.hold = hold
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.stopping = threading.Event()
        canned = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                canned.connections += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                canned.requests.append(json.loads(self.rfile.read(length)))
                n = len(canned.requests) - 1
                body = canned.bodies[min(n, len(canned.bodies) - 1)]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for piece in body:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                if canned.hold:
                    canned.stopping.wait(30)
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Canned:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Start a :class:`Canned` server with the SDKs' variables pointing at it."""
    servers: list[Canned] = []

    def start(bodies: Sequence[Sequence[bytes]], hold: bool = False) -> Canned:
        server = Canned(bodies, hold).__enter__()
        servers.append(server)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        return server

    yield start
    for server in servers:
        server.__exit__()


def event(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name is not None else ""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"{head}data: {text}\n\n".encode()


def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, **more.pop("choice", {})}
    return event({"id": "c1", "object": "chat.completion.chunk", "choices": [choice], **more})


USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 4,
    "prompt_tokens_details": {"cached_tokens": 10},
}


def openai_body(text: str, *, extra: bool = False) -> list[bytes]:
    """An answer in one chunk a character, its finish, its usage and [DONE];
    ``extra``: with fields (and a choice) the harness does not know in each."""
    more: dict[str, Any] = {}
    if extra:
        more = {"service_tier": "flex", "obfuscation": "x1", "choice": {"logprobs": {"a": 1}}}
    pieces = [chunk({"role": "assistant", "content": "", "new_thing": [1]}, **more)]
    pieces += [chunk({"content": c}, **more) for c in text]
    if extra:
        second = {"index": 1, "delta": {"content": "other choice"}, "finish_reason": None}
        pieces.append(event({"id": "c1", "choices": [second], "usage": None}))
    pieces.append(chunk({}, "stop", **more))
    pieces.append(event({"id": "c1", "choices": [], "usage": USAGE}))
    return [*pieces, event("[DONE]")]


def anthropic_body(text: str, *, extra: bool = False) -> list[bytes]:
    usage = {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 10}
    start = {"type": "message_start", "message": {"id": "m1", "usage": usage}}
    pieces = [event(start, "message_start"), event({"type": "ping"}, "ping")]
    block = {"type": "text", "text": ""}
    pieces.append(
        event(
            {"type": "content_block_start", "index": 0, "content_block": block},
            "content_block_start",
        )
    )
    if extra:  # an event of a kind not known here, a delta of a kind not known here
        pieces.append(event({"type": "brand_new", "index": 0, "x": 1}, "brand_new"))
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "new_delta"}}
        pieces.append(event(delta, "content_block_delta"))
    for c in text:
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": c},
        }
        if extra:
            delta["novel"] = {"nested": True}
        pieces.append(event(delta, "content_block_delta"))
    pieces.append(event({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 4},
    }
    pieces.append(event(end, "message_delta"))
    return [*pieces, event({"type": "message_stop"}, "message_stop")]


BODIES = {"openai": openai_body, "anthropic": anthropic_body}
USED = {
    "openai": Usage(30, 4, {"cached_tokens": 10}),
    "anthropic": Usage(30, 4, {"cache_read_input_tokens": 10}),
}


def model_for(provider: str, **params: Any) -> ProviderModel:
    if provider == "openai":
        return harness.OpenAIModel("gpt-test", **params)
    return harness.AnthropicModel("claude-test", **params)


def request(**fields: Any) -> ModelRequest:
    return ModelRequest(run_id="r", goal="go", turn=0, step_index=0, history=list, **fields)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("extra", [False, True], ids=["known", "unknown fields"])
def test_a_turn_is_assembled_from_plain_events(provider: str, extra: bool, canned: Any) -> None:
    text = "Paris\u2028é, 21C"
    server = canned([BODIES[provider](text, extra=extra)])
    pieces: list[str] = []
    turn = model_for(provider).next_turn(request(on_text=pieces.append))
    assert turn.final == text and "".join(pieces) == text and len(pieces) == len(text)
    assert turn.usage == USED[provider]
    assert server.requests[0]["stream"] is True


def stream_error(provider: str, kind: str) -> bytes:
    if provider == "anthropic":
        return event({"type": "error", "error": {"type": kind, "message": "Overloaded"}}, "error")
    return event({"error": {"message": "Overloaded", "type": kind, "code": None}})


@pytest.mark.parametrize(
    ("provider", "kind", "failed"),
    [
        ("openai", "server_error", RetryableModelError),
        ("openai", "invalid_request_error", ModelError),
        ("anthropic", "overloaded_error", RetryableModelError),
        ("anthropic", "invalid_request_error", ModelError),
    ],
)
def test_an_error_event_midway_is_the_sdks_error_classified(
    provider: str, kind: str, failed: type[Exception], canned: Any
) -> None:
    body = BODIES[provider]("a long answer")
    canned([[*body[:5], stream_error(provider, kind)]])
    with pytest.raises(ModelError) as caught:
        model_for(provider).next_turn(request())
    assert type(caught.value) is failed
    assert f"the stream reported {kind}: Overloaded" in str(caught.value)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_error_event_with_no_json_is_an_error_still(provider: str, canned: Any) -> None:
    garbled = event("{not json", "error") if provider == "anthropic" else event({"error": "boom"})
    canned([[*BODIES[provider]("answer")[:3], garbled]])
    with pytest.raises(ModelError, match="the stream reported an error"):
        model_for(provider).next_turn(request())


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_data_that_is_not_json_is_retried_and_the_retry_recorded(
    provider: str, canned: Any, memory_store: MemoryStore
) -> None:
    good = BODIES[provider]("done")
    name = "content_block_delta" if provider == "anthropic" else None
    canned([[*good[:3], event('{"type": "content_block_delta", "ind', name)], good])
    rig = Rig(memory_store)
    register_agent(harness.Agent(name="bot", model=model_for(provider), tools=[]))
    run_id = create_run(rig.runtime(), "bot", "go")
    rig.drive()
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    assert done.result == "done" and rig.store.steps(run_id)[0].retries == 1
    retried = [e.detail or "" for e in rig.store.events(run_id) if e.to_status == "retry_scheduled"]
    assert len(retried) == 1 and "the stream sent data that is not JSON" in retried[0]


@pytest.mark.parametrize(
    ("provider", "wrong"),
    [
        ("openai", {"id": "c1", "choices": "abc"}),
        ("openai", {"id": "c1", "choices": [{"index": 0, "delta": {"content": 5}}]}),
        ("openai", {"id": "c1", "choices": [{"index": 0, "delta": ["content"]}]}),
        ("anthropic", {"type": "content_block_delta", "index": 0, "delta": "text"}),
        ("anthropic", {"type": "message_start", "message": [1]}),
    ],
)
def test_an_event_shaped_unlike_its_api_is_a_garbled_stream(
    provider: str, wrong: dict[str, Any], canned: Any
) -> None:
    body = BODIES[provider]("answer")
    name = wrong["type"] if provider == "anthropic" else None
    canned([[*body[:4], event(wrong, name), *body[4:]]])
    with pytest.raises(
        RetryableModelError, match="the stream sent an event of an unexpected shape"
    ):
        model_for(provider).next_turn(request())


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_without_its_end_is_unfinished(provider: str, canned: Any) -> None:
    canned([BODIES[provider]("a long answer")[:-3]])
    with pytest.raises(RetryableModelError, match="the stream ended before the response did"):
        model_for(provider).next_turn(request())


def test_an_openai_body_is_read_to_its_end_and_its_connection_kept(canned: Any) -> None:
    """After ``[DONE]`` the rest of the body (its last HTTP chunk) is read:
    the connection goes back to the client's pool and the next call uses it."""
    server = canned([openai_body("one")])
    model = model_for("openai")
    assert [model.next_turn(request()).final for _ in range(3)] == ["one"] * 3
    assert server.connections == 1


@pytest.mark.timeout(15)
def test_a_body_left_open_after_done_does_not_hold_the_turn(canned: Any) -> None:
    """A server that sends ``[DONE]`` and keeps the body open: the whole turn
    came, so the call ends with it (its connection closed), not at its
    timeout (past this test's own)."""
    canned([openai_body("whole")], hold=True)
    model = model_for("openai", timeout=60)
    assert model.next_turn(request()).final == "whole"


def test_a_deadline_inside_another_never_extends_it() -> None:
    """The drain's short deadline sits inside the call's: the sooner one holds."""
    from harness.providers.deadline import _left, deadline

    with deadline(0.0), deadline(100.0), pytest.raises(TimeoutError):
        _left(None, TimeoutError)
    with deadline(100.0), deadline(0.0), pytest.raises(TimeoutError):
        _left(None, TimeoutError)
    with deadline(100.0), deadline(50.0):
        assert 0 < (_left(None, TimeoutError) or 0) <= 50.0
