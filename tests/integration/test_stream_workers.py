"""Live answer streams from real workers (harness.streams): what a follower
reads is the answer the step recorded, on the embedded default (the store's
table) and on PostgreSQL with Redis (a Redis stream); a worker killed in the
middle of an answer leaves a ``discard`` for its attempt, and the next
attempt's pieces are the recorded answer, billed once; the API's Server-Sent
Events resume after ``Last-Event-ID`` with nothing lost and nothing repeated.

The providers are the official SDKs talking to tests.wire, whose ``pace``
fault spaces a stream's events so that a test can act in the middle of one.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from harness import api
from harness.records import RunStatus
from harness.streams import stream_key
from tests.apiserver import HARNESS, ApiServer
from tests.cluster import Cluster
from tests.wire import WireServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MakeCluster = Callable[..., Cluster]
#: Long enough to come in many pieces (tests.wire sends 4 characters a delta).
ANSWER = "Effect 1 is done; the ledger says so, and nothing was done twice."
PREAMBLE = "Let me do that first."
#: Usage the wire server reports for the answer, to find it counted once.
USAGE = {"input_tokens": 120, "output_tokens": 30}


def two_turns(pace: float) -> list[dict[str, Any]]:
    """A turn with text and a tool call, then the final answer, both paced."""
    return [
        {
            "text": PREAMBLE,
            "tool_calls": [{"name": "effect", "args": {"n": 1}}],
            "faults": [{"pace": pace}],
        },
        {"text": ANSWER, "faults": [{"pace": pace}]},
    ]


def texts(events: list[dict[str, Any]], step: int, attempt: int) -> list[str]:
    """The text of each token event of ``step``'s ``attempt``, in order."""
    return [
        e["data"]["text"]
        for e in events
        if e["event"] == "token" and (e["data"]["step"], e["data"]["attempt"]) == (step, attempt)
    ]


def recorded_attempt(run_id: str, index: int) -> int:
    """The attempt whose response the step recorded: every call of it counted."""
    step = api.get_steps(run_id)[index]
    return step.attempts + step.retries


# --- 1. the answer as it is written -------------------------------------------------------


@pytest.mark.parametrize(("broker", "bot"), [("filesystem", "openai"), ("redis", "anthropic")])
def test_harness_follow_reads_the_recorded_answer_as_it_is_written(
    make_cluster: MakeCluster, wire: WireServer, broker: str, bot: str
) -> None:
    c = make_cluster(broker)
    c.worker()
    wire.script("write it", two_turns(pace=0.05))
    run_id = api.start_run(f"{bot}-bot", "write it")
    follow = subprocess.run(
        [HARNESS, "follow", run_id, "--json"],
        env=c.env,
        cwd=c.home,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert follow.returncode == 0, f"{follow.stderr}\n{c.logs()}"
    events = [json.loads(line) for line in follow.stdout.splitlines()]
    assert events[-1]["event"] == "end" and events[-1]["data"] == {"status": "completed"}
    assert [e for e in events if e["event"] == "discard"] == []
    steps = api.get_steps(run_id)
    assert [s.kind for s in steps] == ["model", "tool", "model"]
    assert "".join(texts(events, 0, recorded_attempt(run_id, 0))) == steps[0].result["text"]
    answer = texts(events, 2, recorded_attempt(run_id, 2))
    assert "".join(answer) == steps[2].result["final"] == api.get_run(run_id).result == ANSWER
    assert len(answer) > 1, "the answer came as it was written, not at once"
    # Where the pieces were kept: the store's table, or a Redis stream instead.
    in_table = api.reads().store.stream_after(run_id, 0)
    if broker == "filesystem":
        assert in_table
    else:
        run = api.get_run(run_id)
        cache = redis.Redis.from_url(c.env["HARNESS_REDIS_URL"])
        assert cache.xlen(stream_key(run.run_id, run.lineage)) > 0
        cache.close()
        assert in_table == []


# --- 2. a worker killed mid-answer --------------------------------------------------------


@pytest.mark.parametrize(
    ("broker", "bot", "victim"),
    [("filesystem", "openai", "worker"), ("redis", "anthropic", "pool child")],
)
def test_an_answer_cut_off_by_a_sigkill_is_discarded_and_written_again(
    make_cluster: MakeCluster, wire: WireServer, broker: str, bot: str, victim: str
) -> None:
    c = make_cluster(broker)
    c.beat()
    worker = c.worker("--concurrency=1")
    # The first call's stream takes a second an event: the kill lands well inside it.
    wire.script("cut off", [{"text": ANSWER, "usage": USAGE, "faults": [{"pace": 1.0}]}])
    run_id = api.start_run(f"{bot}-bot", "cut off")
    events: list[dict[str, Any]] = []
    for event in api.follow(run_id):
        if event.kind is None:
            continue
        events.append(event.to_dict())
        if event.kind == "token" and len(texts(events, 0, 1)) == 1 and not c.killed:
            # The first piece of attempt 1 is out: the call is under way.
            assert event.data == {"step": 0, "attempt": 1, "text": ANSWER[:4]}
            if victim == "worker":
                c.kill(worker)
                c.worker()
            else:
                (child,) = worker.children()
                c.kill_pid(child)
    assert events[-1]["data"] == {"status": "completed"}, c.logs()
    assert recorded_attempt(run_id, 0) == 2
    assert [e["data"] for e in events if e["event"] == "discard"] == [{"step": 0, "attempt": 1}]
    # Attempt 1's pieces, then its discard, then attempt 2's pieces only.
    kinds = [(e["event"], e["data"].get("attempt")) for e in events if e["event"] != "step"]
    cut = kinds.index(("discard", 1))
    assert set(kinds[:cut]) == {("token", 1)}
    assert set(kinds[cut + 1 : -1]) == {("token", 2)}
    assert ANSWER.startswith("".join(texts(events, 0, 1)))  # what was seen before the kill
    assert "".join(texts(events, 0, 2)) == api.get_steps(run_id)[0].result["final"] == ANSWER
    # The call cut off was never billed; the answer is counted once.
    assert wire.wait_idle(10)
    assert (wire.calls("cut off", 0), wire.billed("cut off", 0)) == (2, 1)
    assert api.reads().run_detail(run_id).to_dict()["usage"] == USAGE
    if victim == "pool child":
        assert worker.proc.poll() is None, "the worker survives its child"


# --- 3. Server-Sent Events, resumed -------------------------------------------------------


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of a ``text/event-stream`` response, as ``harness follow
    --json`` prints them; comments (keep-alives) left out."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if fields:
            yield {"id": fields["id"], "event": fields["event"], "data": json.loads(fields["data"])}
            fields = {}


def read(
    client: httpx.Client, run_id: str, after: str | None = None, tokens: int | None = None
) -> list[dict[str, Any]]:
    """The run's events after ``after``: to the end, or up to and with the
    ``tokens``-th token event, then hanging up."""
    headers = {} if after is None else {"Last-Event-ID": after}
    got: list[dict[str, Any]] = []
    with client.stream("GET", f"/api/runs/{run_id}/events", headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in sse(response):
            got.append(event)
            if tokens is not None and [e["event"] for e in got].count("token") == tokens:
                break
    return got


def without_ids(events: list[dict[str, Any]], kinds: set[str]) -> list[tuple[str, Any]]:
    return [(e["event"], e["data"]) for e in events if e["event"] in kinds]


@pytest.fixture
def served(make_cluster: MakeCluster, wire: WireServer) -> Iterator[ApiServer]:
    """A worker and an API process, on PostgreSQL with Redis."""
    c = make_cluster("redis")
    c.worker()
    server = ApiServer(c.env, c.home)
    yield server
    server.stop()


@pytest.mark.postgres
@pytest.mark.redis
def test_the_event_stream_resumes_after_last_event_id(served: ApiServer, wire: WireServer) -> None:
    server = served
    wire.script("resume", two_turns(pace=0.1))
    run_id = api.start_run("openai-bot", "resume")
    with server.client() as client:
        # Live: hang up after three pieces, reconnect after the last event read.
        first = read(client, run_id, tokens=3)
        assert first[-1]["event"] == "token"
        rest = read(client, run_id, after=first[-1]["id"])
        assert rest[-1] == {**rest[-1], "event": "end", "data": {"status": "completed"}}
        assert api.get_run(run_id).status is RunStatus.COMPLETED
        whole = read(client, run_id)
        # Every piece once, in order, and every transition, as one read of the ended run.
        for kinds in ({"token", "discard"}, {"step"}, {"end"}):
            assert without_ids(first + rest, kinds) == without_ids(whole, kinds)
        assert "".join(texts(whole, 2, recorded_attempt(run_id, 2))) == ANSWER
        # After the fact, the two reads are the one read, ids and all.
        for cut in (1, 5, 9):
            head = read(client, run_id, tokens=cut)
            assert head + read(client, run_id, after=head[-1]["id"]) == whole
        # What is not an id of this stream is refused; a run that is not, unknown.
        for bad in ("12:abc", "x" * 65, "1:2:3"):
            answer = client.get(f"/api/runs/{run_id}/events", headers={"Last-Event-ID": bad})
            assert answer.status_code == 422, answer.text
            assert "last-event-id" in answer.json()["detail"].lower()
        missing = client.get("/api/runs/no-such-run/events")
        assert missing.status_code == 404, missing.text
