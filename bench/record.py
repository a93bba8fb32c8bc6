"""``python -m bench.record``: what a conversation's record weighs, turn by turn (issue 26).

The conversation of bench.conversation (a system prompt of about 2,000
tokens, a user's message, a model turn that calls ``lookup_order``, whose
result is about 1 KB of JSON, the tool step, a model turn that answers in
about 400 characters) is carried through TURNS turns by the real engine in
this process (tests.rig's runtime: no broker, no worker), on PostgreSQL or
on the embedded default, SQLite. The model is the real OpenAI provider with
its HTTP call left out (bench.conversation.OpenAIWithoutHTTP); every request
it builds is noted.

At each of POINTS it measures

- **stored**: the bytes of every value of every row the run has in every
  table that names a run (runs, steps, events, idempotency records,
  signals, blobs, offered tools, stream): text as UTF-8, a number 8 bytes;
  on PostgreSQL also the harness tables' ``pg_total_relation_size`` growth
  since the run began (pages, indexes, TOAST, dead rows: the disk's view);
- **distinct messages**: the messages of the conversation so far, each
  once, as the provider is sent them (:func:`message_bytes`: the UTF-8 of
  their text, tool calls, ids and tool results, without JSON's quoting),
  with and without the system prompt, which the store does not hold (it is
  the agent's: ``OpenAIModel(system=...)``, in the code);
- **naive**: the sum, over every model call so far, of the JSON of the
  whole request it sent, what an engine that records each activity's input
  stores (Temporal's history holds each activity's input and result);
- **statements**: the SQL statements of the turn (the user's message sent,
  both model turns and the tool step), counted by a SQLAlchemy listener, in
  the process that carried the turn before;
- **rebuild**: the transcript rebuilt from the store as a worker new to
  the run does (``Store.steps``, exchanges, ``OpenAIModel.payload``): its
  statements and its time, median of REPEAT, against its length.

And where each record reaches the 50 MB history limit that stopped a
Temporal workflow at 53 of 100 model calls (temporalio/sdk-python#1890):
ours at its measured bytes per turn, the naive one at the request sizes
measured, extended linearly in the turn beyond the last.

A measurement, not a test (tests/unit/test_record_growth.py asserts the
bytes per turn on the embedded store).

    python -m bench.record [--turns 200] [--url URL] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, select, text

import harness
from bench.common import fresh_postgres
from bench.conversation import GOAL, OpenAIWithoutHTTP, lookup_order, user_message
from harness.agents import get_agent
from harness.engine import conversation
from harness.engine.creation import create_run
from harness.providers.transcript import exchanges
from harness.records import RunStatus
from harness.store import schema
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore, make_engine
from tests.rig import Rig

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench_record_run"
AGENT = "bench-record"
TURNS = 200
POINTS = (2, 10, 50, 100, 150, 200)
REPEAT = 5
#: The history limit of a Temporal workflow (temporalio/sdk-python#1890).
LIMIT = 50_000_000
#: The tables whose rows belong to a run (a run_id column).
RUN_TABLES = tuple(t for t in schema.ALL_TABLES if "run_id" in t.c)
#: The columns that hold what was said and done: arguments, results, messages.
CONTENT = {
    "harness_runs": ("goal", "result"),
    "harness_steps": ("args", "result", "approval", "wait"),
    "harness_tool_results": ("result",),
    "harness_signals": ("data",),
    "harness_blobs": ("data",),
    "harness_events": ("detail",),
}


class NotingModel(OpenAIWithoutHTTP):
    """bench.conversation's model, noting the JSON size of every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[int] = []

    def _send(self, method: Any, known: dict[str, Any], timeout: float, on_text: Any) -> Any:
        self.requests.append(len(_compact(known)))
        return super()._send(method, known, timeout, on_text)


harness.register_agent(
    harness.Agent(name=AGENT, model=NotingModel(), tools=[lookup_order], max_steps=100_000)
)


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def message_bytes(message: dict[str, Any]) -> int:
    """A message's bytes as its text: content, tool calls (id, name,
    arguments) and the id a tool message answers, as UTF-8; not its role nor
    JSON's quotes and escapes, which would count a tool result's JSON twice."""
    parts = [message.get("content") or "", message.get("tool_call_id") or ""]
    for call in message.get("tool_calls") or ():
        parts += [call["id"], call["function"]["name"], call["function"]["arguments"]]
    return sum(len(str(p).encode()) for p in parts)


def value_bytes(value: Any) -> int:
    """A stored value's bytes: text as UTF-8, a number or a boolean 8, NULL none."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    return 8


def stored_bytes(engine: Engine, run_id: str) -> dict[str, int]:
    """The bytes of every value of every row of ``run_id``, per table; and,
    under ``"content"``, those of the columns that hold what was said and
    done (:data:`CONTENT`), the rest being bookkeeping (ids, statuses,
    times, counters, events' statuses)."""
    found, content = {}, 0
    with engine.connect() as conn:
        for table in RUN_TABLES:
            rows = conn.execute(select(table).where(table.c.run_id == run_id)).mappings().all()
            found[table.name] = sum(value_bytes(v) for row in rows for v in row.values())
            said = CONTENT.get(table.name, ())
            content += sum(value_bytes(row[c]) for row in rows for c in said)
    return found | {"content": content}


def disk_bytes(engine: Engine) -> int | None:
    """PostgreSQL: the harness tables' size on disk, indexes and TOAST included."""
    if engine.dialect.name != "postgresql":
        return None
    names = [t.name for t in schema.ALL_TABLES]
    query = text(
        "SELECT sum(pg_total_relation_size(CAST(n AS regclass))) FROM unnest(CAST(:n AS text[])) n"
    )
    with engine.connect() as conn:
        return int(conn.execute(query, {"n": names}).scalar_one())


class Statements:
    """Counts the statements an engine executes while :meth:`counting`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.count = 0

    def _seen(self, *_: Any) -> None:
        self.count += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.count = 0
        event.listen(self.engine, "before_cursor_execute", self._seen)
        try:
            yield
        finally:
            event.remove(self.engine, "before_cursor_execute", self._seen)


@dataclass
class Point:
    turn: int
    model_calls: int
    stored: dict[str, int]  # table -> bytes
    disk: int | None  # PostgreSQL: growth of the harness tables since the run began
    messages: int  # distinct messages' bytes, system prompt included
    system: int  # the system prompt's bytes (in the agent's code, not stored)
    naive: int  # the requests' JSON bytes, summed over the model calls so far
    statements: int  # the turn's, in the process that carried the turn before
    rebuild_ms: float  # the transcript rebuilt from the store, nothing kept
    rebuild_statements: int
    request_messages: int  # messages in the last request rebuilt

    @property
    def total(self) -> int:
        return sum(v for k, v in self.stored.items() if k != "content")

    @property
    def ratio(self) -> float:
        """Stored against the distinct messages the store holds (no system prompt)."""
        return self.total / (self.messages - self.system)


@dataclass
class Record:
    backend: str
    turns: int
    points: list[Point] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)  # JSON bytes of each model call's request

    def per_turn(self) -> tuple[float, float]:
        """Bytes stored, and distinct message bytes, per turn over the last points."""
        a, b = self.points[-2], self.points[-1]
        turns = b.turn - a.turn
        return (b.total - a.total) / turns, (b.messages - a.messages) / turns

    def content_per_turn(self) -> float:
        """The bytes of :data:`CONTENT` stored per turn over the last points."""
        a, b = self.points[-2], self.points[-1]
        return (b.stored["content"] - a.stored["content"]) / (b.turn - a.turn)

    def disk_per_turn(self) -> float | None:
        """PostgreSQL: the tables' growth on disk per turn over the last points."""
        a, b = self.points[-2], self.points[-1]
        if a.disk is None or b.disk is None:
            return None
        return (b.disk - a.disk) / (b.turn - a.turn)

    def at_limit(self) -> dict[str, float]:
        """The turn (and model call) at which each record reaches :data:`LIMIT`."""
        last = self.points[-1]
        stored, _ = self.per_turn()
        ours = last.turn + (LIMIT - last.total) / stored
        calls_per_turn = last.model_calls / last.turn
        return {
            "ours_turn": ours,
            "ours_calls": ours * calls_per_turn,
            "naive_calls": naive_calls_to(self.requests, LIMIT),
            "naive_turn": naive_calls_to(self.requests, LIMIT) / calls_per_turn,
        }

    def as_dict(self) -> dict[str, Any]:
        points = [asdict(p) | {"total": p.total, "ratio": p.ratio} for p in self.points]
        stored, messages = self.per_turn()
        summary = {"stored_per_turn": stored, "messages_per_turn": messages}
        summary |= {
            "content_per_turn": self.content_per_turn(),
            "disk_per_turn": self.disk_per_turn(),
        }
        return (
            {"backend": self.backend, "turns": self.turns, "points": points}
            | summary
            | {"at_limit": self.at_limit()}
        )


def naive_calls_to(requests: Sequence[int], limit: int) -> float:
    """The model calls after which the requests' sum reaches ``limit``: the
    measured ones, then each further call's request growing as the last
    hundred calls' did."""
    total = 0
    for n, size in enumerate(requests, 1):
        total += size
        if total >= limit:
            return float(n)
    span = min(100, len(requests) - 1)
    # Calls alternate (a tool call, an answer): the growth over an even span.
    span -= span % 2
    growth = (requests[-1] - requests[-1 - span]) / span
    n, size = len(requests), float(requests[-1])
    while total < limit:
        n, size = n + 1, size + growth
        total += int(size)
    return float(n)


def rebuild(store: SQLStore, counter: Statements, run_id: str) -> tuple[float, int, int]:
    """The next turn's transcript rebuilt from the store with nothing kept
    (a worker new to the run): seconds, statements, messages."""
    model = get_agent(AGENT).model
    assert isinstance(model, NotingModel)
    specs = list(get_agent(AGENT).tool_specs)
    began = time.perf_counter()
    with counter.counting():
        steps = store.steps(run_id)
    history = exchanges(steps, len(steps))
    payload = model.payload(GOAL, history, specs)
    return time.perf_counter() - began, counter.count, len(payload["messages"])


def distinct(store: SQLStore, run_id: str) -> tuple[int, int]:
    """The conversation's messages so far, each once (:func:`message_bytes`),
    and the system prompt's share of them."""
    model = get_agent(AGENT).model
    assert isinstance(model, NotingModel) and model.system is not None
    steps = store.steps(run_id)
    messages = model.payload(GOAL, exchanges(steps, len(steps)), [])["messages"]
    return sum(message_bytes(m) for m in messages), len(model.system.encode())


@contextmanager
def opened(url: str | None) -> Iterator[tuple[SQLStore, str]]:
    """A fresh store: ``url`` (a PostgreSQL database, dropped and made again)
    or, None, the embedded default's SQLite in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="bench-record-") as home:
        if url is None:
            url = f"sqlite:///{home}/harness.db"
            engine = make_engine(url)
            upgrade(engine)
            engine.dispose()
        else:
            fresh_postgres(url)
        store = SQLStore.from_url(url)
        try:
            yield store, store.engine.dialect.name
        finally:
            store.close()


def measure(
    url: str | None = URL, turns: int = TURNS, points: Sequence[int] = POINTS, repeat: int = REPEAT
) -> Record:
    """The conversation carried through ``turns`` turns on ``url`` (None: SQLite)."""
    points = sorted({p for p in points if p <= turns} | {turns})
    model = get_agent(AGENT).model
    assert isinstance(model, NotingModel)
    model.requests = []
    with opened(url) as (store, backend):
        engine = store.engine
        counter = Statements(engine)
        rig = Rig(store)
        rt = rig.runtime()
        assert rt.transcripts is not None
        empty = disk_bytes(engine)
        run_id = create_run(rt, AGENT, GOAL)
        rig.drive()
        record = Record(backend, turns)
        for turn in range(2, turns + 1):
            statements = _turn(rig, rt, counter, run_id, turn)
            if turn not in points:
                continue
            times, read = [], 0
            for _ in range(repeat):
                seconds, read, count = rebuild(store, counter, run_id)
                times.append(seconds * 1000)
            messages, system = distinct(store, run_id)
            disk = disk_bytes(engine)
            record.points.append(
                Point(
                    turn,
                    len(model.requests),
                    stored_bytes(engine, run_id),
                    None if disk is None or empty is None else disk - empty,
                    messages,
                    system,
                    sum(model.requests),
                    statements,
                    statistics.median(times),
                    read,
                    count,
                )
            )
        record.requests = list(model.requests)
    return record


def _turn(rig: Rig, rt: Any, counter: Statements, run_id: str, turn: int) -> int:
    """Carry ``run_id`` through the user's message of ``turn``; its statements."""
    with counter.counting():
        conversation.send_message(rt, run_id, user_message(turn))
        rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED, (turn, run.status, run.error)
    return counter.count


def suite_rows(turns: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``make bench``'s rows (bench.suite.Row's fields), on PostgreSQL and on
    the embedded default, and the figures for its JSON."""
    rows: list[dict[str, Any]] = []
    figures = {}
    for backend, url in (("PostgreSQL", URL), ("embedded SQLite", None)):
        r = measure(url, turns, repeat=3)
        figures[backend] = r.as_dict()
        stored, messages = r.per_turn()
        first, last = r.points[0], r.points[-1]
        rows.append(
            {
                "what": f"record of a {turns}-turn conversation, {backend}: bytes stored per turn",
                "value": stored,
                "unit": "B/turn",
                "baseline": messages,
                "goal": "<= 1.2x",
                "note": f"(ratio: against the turn's new messages; {r.content_per_turn():.0f} "
                "B/turn in the columns holding them)",
            }
        )
        if backend != "PostgreSQL":
            continue
        limit = r.at_limit()
        rows += [
            {
                "what": f"naive record (every request whole) at turn {last.turn}",
                "value": last.naive / 1e6,
                "unit": "MB",
                "baseline": last.total / 1e6,
                "note": "(ratio: against ours)",
            },
            {
                "what": "turn at which our record reaches 50 MB",
                "value": limit["ours_turn"],
                "unit": "turns",
                "baseline": limit["naive_turn"],
                "note": f"(ratio: against the naive record's, {limit['naive_calls']:.0f} "
                "model calls; Temporal stopped at 53 of 100: sdk-python#1890)",
            },
            {
                "what": f"SQL statements of a conversation turn, turn {last.turn} vs {first.turn}",
                "value": last.statements,
                "unit": "statements",
                "baseline": first.statements,
                "goal": "1x",
            },
            {
                "what": f"transcript rebuilt, nothing kept, per message, turn {last.turn} vs "
                f"{first.turn}",
                "value": last.rebuild_ms * 1000 / last.request_messages,
                "unit": "us/message",
                "baseline": first.rebuild_ms * 1000 / first.request_messages,
                "goal": "linear",
                "note": f"({last.rebuild_statements} statement at every length)",
            },
        ]
    return rows, figures


def table(r: Record) -> str:
    lines = [
        f"the record of a {r.turns}-turn conversation, {r.backend} "
        "(system prompt 8 KB, tool results 1 KB); KB",
        f"{'turn':>5}{'calls':>7}{'stored':>10}{'disk':>10}{'messages':>10}{'-system':>9}"
        f"{'ratio':>7}{'naive':>11}{'naive/st':>9}{'stmts':>7}{'rebuild ms':>11}{'msgs':>6}",
    ]
    for p in r.points:
        disk = "" if p.disk is None else f"{p.disk / 1000:10.0f}"
        lines.append(
            f"{p.turn:5d}{p.model_calls:7d}{p.total / 1000:10.1f}{disk or '-':>10}"
            f"{p.messages / 1000:10.1f}{(p.messages - p.system) / 1000:9.1f}{p.ratio:7.2f}"
            f"{p.naive / 1000:11.0f}{p.naive / p.total:9.1f}{p.statements:7d}"
            f"{p.rebuild_ms:11.2f}{p.request_messages:6d}"
        )
    last = r.points[-1]
    by_table = ", ".join(
        f"{k} {v / 1000:.1f}" for k, v in sorted(last.stored.items()) if v and k != "content"
    )
    stored, messages = r.per_turn()
    content, disk = r.content_per_turn(), r.disk_per_turn()
    on_disk = "" if disk is None else f"; on disk {disk:.0f} bytes (pages, indexes, dead rows)"
    limit = r.at_limit()
    first = r.points[0]
    per_message = [p.rebuild_ms / p.request_messages * 1000 for p in (first, last)]
    lines += [
        f"\nstored at turn {last.turn}, by table (KB): {by_table}",
        f"per turn: {stored:.0f} bytes stored for {messages:.0f} bytes of new messages "
        f"({stored / messages:.2f}x), of which {content:.0f} in the columns that hold what "
        f"was said and done ({content / messages:.2f}x){on_disk}",
        f"statements per turn: {first.statements} at turn {first.turn}, "
        f"{last.statements} at turn {last.turn} (the user's message, two model turns, a "
        "tool step)",
        f"rebuild, nothing kept: {per_message[0]:.1f} us/message at turn {first.turn}, "
        f"{per_message[1]:.1f} us/message at turn {last.turn}, in "
        f"{last.rebuild_statements} statement(s)",
        f"the {LIMIT // 1_000_000} MB limit: ours at turn {limit['ours_turn']:,.0f} "
        f"({limit['ours_calls']:,.0f} model calls); the naive record at turn "
        f"{limit['naive_turn']:,.0f} ({limit['naive_calls']:,.0f} model calls)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument("--url", default=URL, help="a PostgreSQL database to drop and re-create")
    parser.add_argument("--sqlite", action="store_true", help="the embedded default instead")
    parser.add_argument("--out", type=Path, help="write record.json here")
    args = parser.parse_args()
    r = measure(None if args.sqlite else args.url, args.turns, repeat=args.repeat)
    print(table(r))
    if args.out:
        (args.out / "record.json").write_text(json.dumps(r.as_dict(), indent=1) + "\n")


if __name__ == "__main__":
    main()
