"""``python -m bench.conversation``: a conversation's turn 200 against its turn 2 (issue 24).

One run of ``bench-conversation`` is carried through TURNS turns by the real
engine in this process (tests.rig's runtime: no broker, no worker, no Redis)
on PostgreSQL. A turn is what a support conversation does: the user's message
(``send_message``: a ``user`` step and a model step), a model turn that calls
a tool (``lookup_order``, whose result is about 1 KB of JSON), the tool step,
and a model turn that answers in about 400 characters, after which the run is
completed until the next message. The model is the real
:class:`~harness.providers.openai.OpenAIModel`, with a system prompt of about
2,000 tokens, whose HTTP call alone is left out: ``_send`` answers as the
service would, usage included. Everything the provider does before the call
is its own, and its responses are recorded, as every provider model's are.

At each of POINTS (turns 2, 10, 50, 100, 200) the completed run, as it stands
before the user's message of that turn, is copied by SQL
(``bench.common.copy_runs``): the copies hold the rows the engine wrote. Then,
in rounds, each point's copy is sent that message and its model turn is
executed (``runner.run_step``, as a worker's task calls it), the points
interleaved (the order reversed every other round), the first round a
warm-up; each figure is the median of REPEAT rounds. A model turn is split
into

- load: the run with the step at its cursor (``Store.load``), and the claim,
  the RUNNING checkpoint a paid model call is made under;
- transcript: what the provider model does before its HTTP call: the run's
  steps read (``Store.steps``), made exchanges
  (``harness.providers.transcript.exchanges``), the request built
  (``OpenAIModel.payload``), then its estimate and the SDK call's arguments
  (``ProviderModel._estimate`` and ``_prepare``);
- checkpoint: the response's record (``Store.put_tool_result``, made before
  the result so that a crash does not pay for the call twice) and the result
  checkpoint (the tool call's step, the next model step, the run's tokens);
- other: the rest of ``run_step`` (gates, transitions, logs, the dispatch);

and the send before it (``send_message``: the message kept, the run continued).

How the transcript is rebuilt, and what it reads. The request is rebuilt
from the start each turn: the system prompt, the goal as the first user
message, then, step by step, a user message, an assistant message with its
tool calls, a tool message per call, or an assistant answer. A worker keeps
the steps of a run that can no longer change, decoded, and the exchanges
made of them (harness.engine.transcripts), so a turn in the worker that
carried the turn before reads one statement from its last kept step on: at
turn 200, 4 rows; a worker new to the run reads every step (797 rows, 464
KB as stored, at turn 200) and decodes each. Each point is measured both
ways, the warm turn in the table's rows, the cold one in its last row:
:func:`prepare` makes the bench's runtime either worker. The turn's other
statements do not grow: one load, one claim, one record, one result, at
every turn. ``main`` prints what it measured.

A measurement, not a test.

    python -m bench.conversation [--turns 200] [--repeat 7] [--url URL] [--out DIR] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

import harness
from bench.common import copy_runs, fresh_postgres
from harness.agents import get_agent
from harness.engine import conversation
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.engine.runtime import Runtime
from harness.engine.taskresult import TaskResult
from harness.models import ModelRequest, ModelTurn, ToolCall, Usage
from harness.providers.openai import OpenAIModel
from harness.records import RunStatus
from harness.store.sql import SQLStore
from tests.rig import Rig

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench_conversation"
AGENT = "bench-conversation"
TURNS = 200
POINTS = (2, 10, 50, 100, 200)
REPEAT = 7

#: (key, label, the measured parts it adds up): the rows of the table.
PARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("load", "load: the run and its step", ("load",)),
    ("claim", "load: the claim (RUNNING checkpoint)", ("claim",)),
    ("read", "transcript: the steps read", ("read",)),
    ("exchanges", "transcript: exchanges", ("exchanges",)),
    ("payload", "transcript: OpenAIModel.payload", ("payload",)),
    ("prepare", "transcript: estimate, SDK arguments", ("prepare",)),
    ("record", "checkpoint: the response's record", ("record",)),
    ("result", "checkpoint: the result", ("result",)),
    ("other", "other (gates, transitions, dispatch)", ("other",)),
    ("load_all", "LOAD", ("load", "claim")),
    ("transcript", "TRANSCRIPT", ("read", "exchanges", "payload", "prepare")),
    ("checkpoint", "CHECKPOINT", ("record", "result")),
    ("total", "MODEL TURN (run_step)", ("total",)),
    ("send", "send_message, before it", ("send",)),
)

RULES = (
    "Look the order up before saying anything about its status, its amount or its delivery.",
    "A refund over 200.00 needs a supervisor: say so, and offer to open the request.",
    "Never promise a delivery date the carrier has not given; give the carrier's words.",
    "Summarise what was done at the end of each answer, in one short sentence.",
)
ITEMS = ("linen shirt", "wool socks", "rain jacket", "canvas tote", "desk lamp", "tea kettle")
STATUSES = ("placed", "packed", "shipped", "in transit", "delivered", "returned")
ANSWER = (
    "I have looked at the order: it left our warehouse and the carrier has it. The second "
    "charge is an authorisation that was never captured; it drops off your statement within "
    "five working days, and nothing more will be taken. If the parcel has not moved in two "
    "more days, I will open a claim with the carrier and send a replacement. Summary: order "
    "checked, no double charge."
)


def _system_prompt(chars: int = 8000) -> str:
    """About 2,000 tokens of policy (the provider's estimate: 4 characters a token)."""
    lines = ["You are the support assistant of an online shop. Follow these rules."]
    while sum(len(line) + 1 for line in lines) < chars:
        n = len(lines) - 1
        lines.append(f"{n + 1}. {RULES[n % len(RULES)]} (policy {n // len(RULES) + 1})")
    return "\n".join(lines)


SYSTEM = _system_prompt()
GOAL = "Hello, my order A-10001 has not arrived yet. Can you tell me where it is?"


def user_message(turn: int) -> str:
    """What the customer says at ``turn``: about 150 characters."""
    return (
        f"Thanks. Now about order A-{10000 + turn}: I was charged twice, I think, and the "
        f"tracking page has said the same thing for {turn % 9 + 2} days. What can you do?"
    )


@harness.tool(effect="read_only")
def lookup_order(order_id: str) -> dict[str, Any]:
    """An order as the shop's API returns it: about 1 KB of JSON."""
    n = int(order_id.rsplit("-", 1)[-1])
    return {
        "order_id": order_id,
        "status": STATUSES[n % len(STATUSES)],
        "placed_at": f"2026-11-{n % 28 + 1:02d}T10:{n % 60:02d}:00Z",
        "customer": {"name": f"Customer {n}", "email": f"customer{n}@example.com"},
        "items": [
            {
                "sku": f"SKU-{(n + i) % 997:03d}",
                "name": ITEMS[(n + i) % len(ITEMS)],
                "quantity": 1 + (n + i) % 3,
                "unit_cents": 1299 + 100 * ((7 * n + i) % 40),
            }
            for i in range(5)
        ],
        "shipping": {
            "carrier": "Parcel Express",
            "tracking": f"PX{n:010d}",
            "address": f"{n % 90 + 1} Harbour Street, Portsmouth PO1 {n % 9}AB",
        },
        "payments": [
            {"id": f"pay_{n}_{i}", "amount_cents": 8421 + n % 100, "state": "captured"}
            for i in range(2)
        ],
        "events": [
            {"at": f"2026-11-{n % 28 + 1:02d}T{h:02d}:00:00Z", "what": STATUSES[h % 4]}
            for h in range(9, 12)
        ],
    }


class Split:
    """Seconds spent in each named part of the turn being measured, and the
    part under way (for the statements' census)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.checkpoints = 0
        self.current = "other"

    def reset(self) -> None:
        self.spent.clear()
        self.checkpoints = 0

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        began, outer = time.perf_counter(), self.current
        self.current = outer if outer == "send" else name  # a send's statements are its own
        try:
            yield
        finally:
            self.current = outer
            self.spent[name] += time.perf_counter() - began


SPLIT = Split()


class OpenAIWithoutHTTP(OpenAIModel):
    """The real OpenAI provider with its HTTP call left out: ``_send`` answers
    as the service would, a lookup after the user's message, then an answer,
    with the usage it reports. ``census``: note the request's size."""

    def __init__(self) -> None:
        super().__init__("gpt-4.1-mini", system=SYSTEM, temperature=0)
        self.census: dict[str, int] | None = None
        self._began = 0.0

    def _make_client(self) -> Any:  # made once per process, never called
        return self.sdk.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1", max_retries=0)

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        self._began = time.perf_counter()
        return super().next_turn(request)

    def _payload(self, request: ModelRequest) -> dict[str, Any]:
        with SPLIT.part("build"):
            return super()._payload(request)

    def payload(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with SPLIT.part("payload"):
            return super().payload(*args, **kwargs)

    def _send(
        self,
        method: Callable[..., Any],
        known: dict[str, Any],
        timeout: float,
        on_text: Callable[[str], None] | None,
    ) -> ModelTurn:
        SPLIT.spent["transcript"] += time.perf_counter() - self._began
        # The conversation goes in extra_body (ProviderModel.verbatim), as the wire sends it.
        messages = known.get("extra_body", {}).get("messages") or known["messages"]
        if self.census is not None:
            self.census["messages"] = len(messages)
            self.census["request_bytes"] = len(json.dumps(known, default=str).encode())
        usage = Usage(sum(len(str(m.get("content"))) for m in messages) // 4, 90)
        if messages[-1]["role"] == "tool":
            return ModelTurn(final=ANSWER, usage=usage, stop_reason="stop")
        order = f"A-{10000 + len(messages)}"
        call = ToolCall("lookup_order", {"order_id": order}, f"call_{len(messages)}")
        return ModelTurn(tool_calls=(call,), usage=usage, stop_reason="tool_calls")


harness.register_agent(
    harness.Agent(name=AGENT, model=OpenAIWithoutHTTP(), tools=[lookup_order], max_steps=100_000)
)


class Timed:
    """The store, timing the calls a model turn is split by (the first
    checkpoint of a turn is its claim, the second its result); every other
    call passes through. ``start``, ``rows``: where the last steps read began,
    and how many rows it returned."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store
        self.start = 0
        self.rows = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def load(self, *args: Any, **kwargs: Any) -> Any:
        with SPLIT.part("load"):
            return self.store.load(*args, **kwargs)

    def steps(self, *args: Any, **kwargs: Any) -> Any:
        with SPLIT.part("read"):
            found = self.store.steps(*args, **kwargs)
        self.start, self.rows = (found[0].index if found else 0), len(found)
        return found

    def checkpoint(self, checkpoint: Any) -> int:
        name = "claim" if SPLIT.checkpoints == 0 else "result"
        SPLIT.checkpoints += 1
        with SPLIT.part(name):
            return self.store.checkpoint(checkpoint)

    def put_tool_result(self, *args: Any, **kwargs: Any) -> Any:
        with SPLIT.part("record"):
            return self.store.put_tool_result(*args, **kwargs)


@dataclass
class Conversation:
    turns: int
    repeat: int
    points: tuple[int, ...]
    medians: dict[int, dict[str, float]]  # point -> part key -> ms
    reads: dict[str, Any]  # what the transcript read at the last point
    build_s: float  # carrying the conversation through its turns, copies included
    cold: dict[int, float]  # point -> ms of the model turn in a worker new to the run

    def ratio(self, key: str = "total") -> float:
        first, last = self.points[0], self.points[-1]
        return self.medians[last][key] / self.medians[first][key]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": {key: self.ratio(key) for key, _, _ in PARTS}}


def prepare(rig: Rig, rt: Runtime, run_id: str, warm: bool) -> None:
    """Make this process the worker that carried the turn before ``run_id``'s
    next (``warm``: its transcript cache keeps the steps behind that turn's
    answer, and their exchanges, as that turn left them), or one new to the
    run (nothing kept)."""
    assert rt.transcripts is not None
    rt.transcripts.forget(run_id)
    if warm:
        run = rig.load(run_id)
        answered = run.step_count - 1  # the last turn's step: its answer
        rt.transcripts.read(rig.store, replace(run, cursor=answered)).exchanges(answered)


def one_turn(
    rig: Rig, rt: Runtime, run_id: str, turn: int, warm: bool | None = True
) -> dict[str, float]:
    """Send ``run_id``, a completed run, the user's message of ``turn`` and
    execute the model step it makes; each part's seconds. ``warm``: in a
    worker that carried the turn before, or (False) in one new to the run
    (:func:`prepare`); None: as the caller prepared it."""
    if warm is not None:
        prepare(rig, rt, run_id, warm)
    began = time.perf_counter()
    with SPLIT.part("send"):
        conversation.send_message(rt, run_id, user_message(turn))
    sent = time.perf_counter() - began
    (sent_to, cursor) = rig.sent.pop()
    assert sent_to == run_id and not rig.sent, rig.sent
    SPLIT.reset()
    began = time.perf_counter()
    outcome = run_step(rt, run_id, cursor)
    total = time.perf_counter() - began
    assert outcome is TaskResult.ADVANCED and SPLIT.checkpoints == 2, (outcome, SPLIT.spent)
    rig.sent.clear()  # the tool step's message: the copy goes no further
    spent = SPLIT.spent
    parts = {
        "load": spent["load"],
        "claim": spent["claim"],
        "read": spent["read"],
        "exchanges": spent["build"] - spent["read"] - spent["payload"],
        "payload": spent["payload"],
        "prepare": spent["transcript"] - spent["build"],
        "record": spent["record"],
        "result": spent["result"],
    }
    parts["other"] = total - sum(parts.values())
    return parts | {"total": total, "send": sent}


def build(
    rig: Rig, rt: Runtime, turns: int, points: Sequence[int], copies: int
) -> dict[int, list[str]]:
    """Carry a conversation through ``turns`` turns; at each of ``points``,
    ``copies`` copies of the run as it stands before that turn's message."""
    run_id = create_run(rt, AGENT, GOAL)
    rig.drive()
    engine = rig.store.store.engine  # type: ignore[attr-defined]
    made = {}
    for turn in range(2, turns + 1):
        if turn in points:
            made[turn] = [f"{run_id}-t{turn}-{n}" for n in range(copies)]
            copy_runs(engine, run_id, made[turn])
        conversation.send_message(rt, run_id, user_message(turn))
        rig.drive()
        run = rig.load(run_id)
        assert run.status is RunStatus.COMPLETED, (turn, run.status, run.error)
    return made


def census(
    rig: Rig, rt: Runtime, model: OpenAIWithoutHTTP, run_id: str, turn: int
) -> dict[str, Any]:
    """What the transcript of ``turn`` reads: statements by part, rows, bytes
    stored; and the request it makes (messages, bytes of its JSON)."""
    timed: Timed = rig.store  # type: ignore[assignment]
    statements: dict[str, int] = defaultdict(int)

    def seen(*_: Any) -> None:
        statements[SPLIT.current] += 1

    engine = timed.store.engine
    prepare(rig, rt, run_id, warm=True)
    model.census = {}
    event.listen(engine, "before_cursor_execute", seen)
    try:
        one_turn(rig, rt, run_id, turn, warm=None)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    request, model.census = model.census, None
    measured = text(
        "SELECT count(*), sum(pg_column_size(s.*)), "
        "sum(octet_length(s.args) + coalesce(octet_length(s.result), 0)) "
        "FROM harness_steps s WHERE run_id = :r AND idx >= :a AND idx < :b"
    )
    with engine.connect() as conn:
        bounds = {"r": run_id, "a": timed.start, "b": timed.start + timed.rows}
        rows, stored, json_bytes = conn.execute(measured, bounds).one()
    counted = {"statements": dict(statements), "rows": int(rows), "stored_bytes": int(stored)}
    counted |= {"first_row": timed.start}
    return counted | {"json_bytes": int(json_bytes), **request}


def measure(
    turns: int = TURNS,
    repeat: int = REPEAT,
    points: Sequence[int] = POINTS,
    url: str | None = None,
    profile: bool = False,
) -> Conversation:
    """The conversation carried through ``turns`` turns on ``url`` (dropped and
    re-created; None: :data:`URL`), its model turns measured at ``points``."""
    points = tuple(p for p in points if p <= turns)
    url = url or URL
    fresh_postgres(url)
    store = SQLStore.from_url(url)
    rig = Rig(Timed(store))  # type: ignore[arg-type]
    model = get_agent(AGENT).model
    assert isinstance(model, OpenAIWithoutHTTP)
    began = time.perf_counter()
    rt = rig.runtime()
    # Per point: the warm rounds (and the warm-up), the cold ones, the census's, the profile's.
    cold_at = repeat + 1
    census_at = cold_at + repeat
    copies = build(rig, rt, turns, points, census_at + 1 + (repeat if profile else 0))
    build_s = time.perf_counter() - began
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    samples: dict[int, list[dict[str, float]]] = {p: [] for p in points}
    cold: dict[int, list[float]] = {p: [] for p in points}
    for r in range(repeat + 1):  # round 0 warms up
        for point in points if r % 2 else reversed(points):
            parts = one_turn(rig, rt, copies[point][r], point)
            if r:
                samples[point].append(parts)
                new = one_turn(rig, rt, copies[point][cold_at + r - 1], point, warm=False)
                cold[point].append(new["total"] * 1000)
    medians = {
        p: {
            key: statistics.median(_sum(s, members) for s in samples[p])
            for key, _, members in PARTS
        }
        for p in points
    }
    reads = census(rig, rt, model, copies[points[-1]][census_at], points[-1])
    if profile:
        _profile(rig, rt, copies[points[-1]][census_at + 1 :], points[-1])
    store.close()
    cold_ms = {p: statistics.median(cold[p]) for p in points}
    return Conversation(
        turns, repeat, points, medians, reads | {"turn": points[-1]}, build_s, cold_ms
    )


def _sum(sample: dict[str, float], members: Sequence[str]) -> float:
    return sum(sample[m] for m in members) * 1000


def _profile(rig: Rig, rt: Runtime, run_ids: Sequence[str], turn: int) -> None:
    """cProfile over the model turns of ``run_ids``: where turn ``turn``'s time goes."""
    profiler = cProfile.Profile()
    for run_id in run_ids:
        prepare(rig, rt, run_id, warm=True)
        profiler.enable()
        one_turn(rig, rt, run_id, turn, warm=None)
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    print(f"\ncProfile of {len(run_ids)} sends and model turns at turn {turn}, by own time")
    print(out.getvalue())


def table(c: Conversation) -> str:
    first, last = c.points[0], c.points[-1]
    head = "".join(f"{'turn ' + str(p):>10}" for p in c.points)
    lines = [
        f"model turn of a {c.turns}-turn conversation, ms, median of {c.repeat} (interleaved)",
        f"{'part':<40}{head}{f'{last}/{first}':>9}",
        "-" * (49 + 10 * len(c.points)),
    ]
    for key, label, _ in PARTS:
        if key == "load_all":
            lines.append("-" * (49 + 10 * len(c.points)))
        cells = "".join(f"{c.medians[p][key]:10.3f}" for p in c.points)
        lines.append(f"{label:<40}{cells}{c.ratio(key):8.2f}x")
    cells = "".join(f"{c.cold[p]:10.3f}" for p in c.points)
    cold_ratio = c.cold[last] / c.cold[first]
    lines.append(f"{'MODEL TURN, a worker new to the run':<40}{cells}{cold_ratio:8.2f}x")
    r = c.reads
    said = ", ".join(f"{part} {n}" for part, n in sorted(r["statements"].items()))
    lines += [
        "",
        f"what the transcript of turn {r['turn']} read and made: statements of the turn by part "
        f"({said}); the steps read: {r['rows']} rows from index {r['first_row']}, "
        f"{r['stored_bytes'] / 1000:.0f} KB "
        f"stored, of which {r['json_bytes'] / 1000:.0f} KB of JSON in args and result; the "
        f"request: {r['messages']} messages, {r['request_bytes'] / 1000:.0f} KB of JSON",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument("--url", default=URL, help="a database to drop and re-create")
    parser.add_argument("--out", type=Path, help="write conversation.json here")
    parser.add_argument("--profile", action="store_true", help="cProfile the last point's turns")
    args = parser.parse_args()
    c = measure(args.turns, args.repeat, url=args.url, profile=args.profile)
    print(table(c))
    print(f"\nthe conversation built in {c.build_s:.1f} s, copies included")
    if args.out:
        (args.out / "conversation.json").write_text(json.dumps(c.as_dict(), indent=1) + "\n")


if __name__ == "__main__":
    main()
