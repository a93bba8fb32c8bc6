"""No imported run sticks, loops or acts for an operator: a property test.

docs/EXPORT.md promises that a run imported from any document (written by
hand, its hash recomputed, as a forger would) either is refused at import,
or, carried by this store's workers and sweeper, ends, or waits for an
operator with an ``attention`` that names the action, which is then
accepted. Hypothesis builds the documents from a finished run's export: any
run status, cursor and step statuses, steps after the cursor, operators'
words (well formed or not) on each call, tool records kept or not, and
wake-up, lease, re-send, attempt and version values from the ordinary to
the absurd. The engine is the real one, in-process on SQLite with a
hand-moved clock (tests/rig.py): every sweep and step happens when the test
says, so a run that is still moving after many sweeps is stuck, not slow.

Deferred calls (issue 23) are drawn too: calls of the turn before the
cursor waiting on a callback, a signal, a sleep or a child run, well formed
or not, with the run's ``deferred_from`` where the engine puts it or off by
one. A run waiting on its calls is answered here as the world would (or an
operator with `harness complete`) when nothing else moves it.

Beside it: the gated call is never made more often than an operator here
approved it, whatever words the document carried.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import harness
from harness.engine import operations, recovery, waits
from harness.engine.creation import create_run
from harness.engine.transitions import Decision
from harness.errors import BadArchive
from harness.reads import attention
from harness.records import Run, RunStatus
from harness.runs import archive
from harness.store.sql import SQLStore
from tests.rig import Rig

#: Which tools were called, in order, in this process.
CALLS: list[str] = []


@harness.tool(effect="idempotent", requires_approval=True)
def prop_gated(amount: int, ctx: harness.ToolContext) -> str:
    CALLS.append("gated")
    return f"paid {amount}"


@harness.tool(effect="at_most_once")
def prop_once(ctx: harness.ToolContext) -> str:
    CALLS.append("once")
    return "sent"


@harness.tool(effect="idempotent")
def prop_plain(ctx: harness.ToolContext) -> str:
    CALLS.append("plain")
    return "done"


AGENT = "archive-states"
harness.register_agent(
    harness.Agent(
        name=AGENT,
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "prop_gated", "args": {"amount": 1}},
                        {"name": "prop_once", "args": {}},
                        {"name": "prop_plain", "args": {}},
                    ]
                },
                {"final": "all done"},
            ]
        ),
        tools=[prop_gated, prop_once, prop_plain],
    )
)

#: Steps of the template: 0 model, 1 gated, 2 once, 3 plain, 4 model (final).
STEPS = 5
TOOL_STEPS = (1, 2, 3)
#: Sweeps (each after 64 lease TTLs, past the longest re-send back-off) a
#: moving run gets to end or to stop for an operator.
ROUNDS = 8
#: Operator actions a run gets to end after (each moves it on).
ACTIONS = 4

APPROVED = {"decision": "approved", "by": "op-there", "at": 1_000_000.0}
REJECTED = {"decision": "rejected", "by": "op-there", "at": 1_000_000.0, "reason": "no"}


@pytest.fixture
def template(sqlite_store: SQLStore) -> Iterator[dict[str, Any]]:
    """The export of the agent's run, carried to the end with the gated call approved."""
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), AGENT, "pay, send, tidy", "run-states")
    rig.drive()
    operations.decide(rig.runtime(), run_id, approve=True, who="op-there")
    rig.drive()
    assert sqlite_store.load(run_id).status is RunStatus.COMPLETED
    yield archive.export_run(sqlite_store, run_id)


#: Every step status, the usual ones at the ends (which Hypothesis draws
#: more often than the middle of a list).
ANY_STEP = ["pending", "in_doubt", "awaiting_approval", "deferred", "failed", "running", "done"]
#: What the engine leaves at the cursor of a run of each status (a terminal
#: run: anything); other statuses are drawn as often.
AT_CURSOR = {
    "pending": ["pending", "running"],
    "running": ["pending", "running"],
    "paused": ["pending", "running"],
    "waiting": ["in_doubt", "awaiting_approval"],
}
#: Lease, wake-up, re-send and attempt values a deployment writes...
SANE = {
    "lease": [(None, None), ("w-there/1", 1_000_030.0), ("sweeper", 0.0), ("rescheduled", 0.0)],
    "wake_at": [None, 1_000_030.0, 990_000.0],
    "resends": [0, 3],
    "attempts": [0, 1, 4, 5],
    "version": [40],
}
#: ... and ones none writes: far off, negative, at or past the column's bound.
HOSTILE = {
    "lease": [("w-there/1", 4e9), ("w", 1e15), ("w", -1.0)],
    "wake_at": [4e9, 1e15, -1.0, 0.0],
    "resends": [2**31 - 1],
    "attempts": [2**31 - 1, 2**31],
    "version": [2**31 - 1, 2**40],
}
#: Words on calls: well formed or not.
WORDS = [APPROVED, {}, {"decision": "approved"}, REJECTED]
#: Run statuses and cursors, those of runs that go on at the ends.
RUN_STATUSES = ["running", "paused", "completed", "failed", "cancelled", "diverged", "pending"]
RUN_STATUSES += ["waiting"]
CURSORS = [1, 2, 3, 0, 4, 5]
#: At most one step other than the cursor's out of its place.
ODD = [None, 0, 1, 2, 3, 4, None]
#: What a deferred call waits for: as the engine stores it (a timeout long
#: past, one far off, none), and not (no wait, no kind, a signal with no name).
WAITS: list[dict[str, Any] | None] = [
    {"kind": "callback", "until": 1_000_060.0, "timeout": 60.0},
    {"kind": "signal", "until": 3_000_000.0, "timeout": 1e6, "signal": "paid"},
    {"kind": "sleep", "until": 1_000_600.0, "timeout": 600.0},
    {"kind": "child", "until": None, "child": "run-states:1"},
    {"kind": "callback", "until": None},
    None,
    {"kind": "nope", "until": None},
    {"kind": "signal", "until": None},
]
#: A run that deferred calls: its status and its cursor (a call of the same
#: turn, or the model turn that waits for them).
DEFERRING = ["waiting", "running", "paused", "cancelled", "pending"]
DEFERRED_CURSORS = [4, 2, 3]


@st.composite
def documents(draw: st.DrawFn, template: dict[str, Any]) -> dict[str, Any]:
    """A variation of ``template``'s state, hashed as a forger would: any run
    status and cursor, any status at the cursor, maybe one other step out of
    place, maybe words on calls, maybe one value no deployment writes."""
    doc = copy.deepcopy(template)
    run, steps = doc["run"], doc["steps"]
    deferring = draw(st.sampled_from([False, False, True]))
    status = draw(st.sampled_from(DEFERRING if deferring else RUN_STATUSES))
    cursor = draw(st.sampled_from(DEFERRED_CURSORS if deferring else CURSORS))
    run.update(status=status, cursor=cursor)
    for step in steps:
        step["status"] = "done" if step["idx"] < cursor else "pending"
        step["approval"] = None
    if cursor < STEPS and not deferring:
        usual = st.sampled_from(AT_CURSOR.get(status, ANY_STEP))
        steps[cursor]["status"] = draw(st.one_of(usual, st.sampled_from(ANY_STEP)))
    if deferring:
        _defer(draw, run, steps)
    odd = draw(st.sampled_from(ODD))
    if odd is not None and odd != cursor:
        steps[odd]["status"] = draw(st.sampled_from(ANY_STEP))
    words_on = draw(st.lists(st.sampled_from(TOOL_STEPS), max_size=3, unique=True))
    if cursor in TOOL_STEPS and draw(st.booleans()):
        words_on.append(cursor)  # the call the run is at: the forger's first choice
    for index in words_on:
        steps[index]["approval"] = draw(st.sampled_from(WORDS))
    kept = [r for r in doc["tool_records"] if draw(st.booleans())]
    doc["tool_records"] = kept
    doc["manifest"]["counts"]["tool_records"] = len(kept)
    hostile = draw(st.sampled_from([None, *sorted(HOSTILE), None]))
    value = {k: draw(st.sampled_from((HOSTILE if k == hostile else SANE)[k])) for k in SANE}
    owner, lease = value["lease"]
    run.update(
        owner=owner,
        lease_expires_at=lease,
        wake_at=value["wake_at"],
        resends=value["resends"],
        version=value["version"],
        pause_requested=draw(st.booleans()),
    )
    if cursor < STEPS:
        steps[cursor]["attempts"] = value["attempts"]
    doc["manifest"]["sha256"] = archive.content_hash(doc)
    return doc


def _defer(draw: st.DrawFn, run: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    """Calls before the cursor deferred, each on a wait drawn from WAITS, and
    ``deferred_from`` the first of them, or a step off."""
    before = [i for i in TOOL_STEPS if i < run["cursor"]]
    deferred = draw(st.lists(st.sampled_from(before), min_size=1, max_size=2, unique=True))
    for index in deferred:
        steps[index].update(status="deferred", result=None, finished_at=None)
        steps[index]["wait"] = draw(st.sampled_from(WAITS))
    first = min(deferred)
    run["deferred_from"] = draw(st.sampled_from([first, first, None, first - 1, first + 1]))


def settled(rig: Rig, run_id: str) -> Run:
    """The run once this deployment's workers and sweeper have done all they would."""
    for _ in range(ROUNDS):
        rig.drive()
        run = rig.store.load(run_id)
        if not run.status.movable:
            return run
        rig.clock.advance(64 * rig.lease_ttl)
        recovery.sweep(rig.runtime("sweeper"))
    return rig.store.load(run_id)


def act(rig: Rig, run: Run, approve: bool) -> bool:
    """What an operator does for ``run``'s attention, asserted to be accepted;
    True if it approved a call."""
    need = attention(run, rig.clock.now(), running_alert=1e12)
    rt = rig.runtime("op-here")
    if need is None and run.waits_on_calls:  # the world answers (or `harness complete`)
        answered = waits.complete(rt, run.run_id, None, result={"answered": True}, by="op-here")
        assert answered.changed, answered.said
        return False
    if need == "in_doubt":
        operations.resolve(rt, run.run_id, Decision.SUCCEEDED, {"adopted": True})
        return False
    if need == "awaiting_approval":
        changed = operations.decide(rt, run.run_id, approve=approve, who="op-here").changed
        assert changed, "the word was not acted on"
        return approve
    if need == "paused":
        changed = operations.resume(rt, run.run_id, "op-here").changed
        assert changed, "resume did not move the run"
        return False
    raise AssertionError(f"{run.status} run, attention {need!r}: no action an operator could take")


def carried(store: SQLStore, document: dict[str, Any], approve: Iterator[bool]) -> str:
    """Import ``document`` into the emptied ``store`` and carry the run as this
    deployment would, an operator here taking each action its attention
    names (approving or not as ``approve`` says), asserting the property on
    the way. What happened: ``refused``, or the status the run ended in."""
    store.reset()
    CALLS.clear()
    rig = Rig(store)
    rig.clock.t = 2_000_000.0
    try:
        run_id = archive.import_run(store, document, now=rig.clock.now()).run_id
    except BadArchive:
        return "refused"
    approved_here = 0
    for _ in range(ACTIONS):
        run = settled(rig, run_id)
        assert CALLS.count("gated") <= approved_here, "a gated call made on a foreign word"
        if run.status.terminal:
            return str(run.status)
        assert run.status.held, f"still {run.status} after {ROUNDS} sweeps: stuck or looping"
        approved_here += act(rig, run, next(approve))
    run = settled(rig, run_id)
    assert CALLS.count("gated") <= approved_here, "a gated call made on a foreign word"
    assert run.status.terminal, f"{run.status} after {ACTIONS} operator actions"
    return str(run.status)


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    derandomize=True,  # the same documents on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_an_imported_run_ends_or_waits_for_an_operator_here(
    template: dict[str, Any], sqlite_store: SQLStore, data: st.DataObject
) -> None:
    document = data.draw(documents(template))
    outcome = carried(sqlite_store, document, iter(lambda: data.draw(st.booleans()), None))
    deferred = any(s["status"] == "deferred" for s in document["steps"])
    event(f"{'deferred calls, ' if deferred else ''}{outcome}")  # --hypothesis-show-statistics


def placed(template: dict[str, Any], status: str, cursor: int, at_cursor: str) -> dict[str, Any]:
    """``template`` as a run of ``status`` at ``cursor``, whose step there is
    ``at_cursor``: the steps before it done, those after pending."""
    doc = copy.deepcopy(template)
    doc["run"].update(status=status, cursor=cursor)
    for step in doc["steps"]:
        step["status"] = "done" if step["idx"] < cursor else "pending"
        step["approval"] = None
    if cursor < STEPS:
        doc["steps"][cursor]["status"] = at_cursor
    doc["tool_records"] = [r for r in doc["tool_records"] if r["step_index"] < cursor]
    doc["manifest"]["counts"]["tool_records"] = len(doc["tool_records"])
    return doc


def test_every_run_status_cursor_and_word(template: dict[str, Any], sqlite_store: SQLStore) -> None:
    """The whole space of run status x cursor x status at the cursor x word on
    the call there, each imported and carried as above; and the property is
    not met by refusing everything: the states the engine writes arrive and
    end or wait as they would have."""
    outcomes = {}
    approve = itertools.cycle([True, False])
    for status, cursor, at_cursor, word in itertools.product(
        [str(s) for s in RunStatus], range(STEPS + 1), ANY_STEP, [None, APPROVED, REJECTED]
    ):
        doc = placed(template, status, cursor, at_cursor)
        if cursor in TOOL_STEPS:
            doc["steps"][cursor]["approval"] = word
        elif word is not None:
            continue
        doc["manifest"]["sha256"] = archive.content_hash(doc)
        outcomes[(status, cursor, at_cursor, word and word["decision"])] = carried(
            sqlite_store, doc, approve
        )
    expected = {
        ("running", 1, "pending", None): "completed",  # the gated call, approved here
        ("running", 1, "pending", "approved"): "completed",  # the same: the word was dropped
        ("running", 1, "running", "approved"): "refused",  # may be under way there
        ("running", 2, "running", None): "completed",  # at_most_once: in doubt, resolved here
        ("running", 3, "running", None): "completed",  # idempotent: made again
        ("waiting", 2, "in_doubt", None): "completed",
        ("waiting", 1, "awaiting_approval", "approved"): "completed",
        ("waiting", 1, "pending", None): "refused",
        ("paused", 3, "pending", None): "completed",
        ("paused", 1, "awaiting_approval", None): "refused",
        ("running", 2, "in_doubt", None): "refused",
        ("cancelled", 2, "running", "approved"): "cancelled",
    }
    assert {k: outcomes[k] for k in expected} == expected
    assert sum(o != "refused" for o in outcomes.values()) > 100


CALLBACK = WAITS[0]
SIGNAL, SLEEP, CHILD = WAITS[1], WAITS[2], WAITS[3]


def deferring(
    template: dict[str, Any],
    status: str,
    cursor: int,
    waits_on: dict[int, dict[str, Any] | None],
    deferred_from: int | None = -1,
    at_cursor: str = "pending",
) -> dict[str, Any]:
    """``template`` as a run that deferred the calls ``waits_on`` names (each
    on its wait), its ``deferred_from`` the first of them unless given."""
    doc = placed(template, status, cursor, at_cursor)
    for index, wait in waits_on.items():
        doc["steps"][index].update(status="deferred", result=None, finished_at=None, wait=wait)
    first = min(waits_on) if waits_on else None
    doc["run"]["deferred_from"] = first if deferred_from == -1 else deferred_from
    doc["manifest"]["sha256"] = archive.content_hash(doc)
    return doc


def test_deferred_calls_arrive_where_the_engine_leaves_them(
    template: dict[str, Any], sqlite_store: SQLStore
) -> None:
    """The states a run that deferred calls is left in arrive and end (each
    wait answered in its way: a timeout, a sleep's end, the world); those no
    engine writes are refused, naming why."""
    approve = itertools.cycle([True])
    arrive = {
        "waiting at its turn, on each kind": deferring(
            template, "waiting", 4, {1: CHILD, 2: SLEEP, 3: SIGNAL}
        ),
        "a callback timed out": deferring(template, "waiting", 4, {3: CALLBACK}),
        "running, a later call of the turn next": deferring(template, "running", 2, {1: CALLBACK}),
        "running, every answer in": deferring(template, "running", 4, {}, deferred_from=2),
        "paused at its turn": deferring(template, "paused", 4, {2: SLEEP}),
        "cancelled while it waited": deferring(template, "cancelled", 4, {1: SIGNAL}),
    }
    assert {k: carried(sqlite_store, d, approve) for k, d in arrive.items()} == {
        "waiting at its turn, on each kind": "completed",
        "a callback timed out": "completed",
        "running, a later call of the turn next": "completed",
        "running, every answer in": "completed",
        "paused at its turn": "completed",
        "cancelled while it waited": "cancelled",
    }
    refused = {
        "a deferred call with no wait": (
            deferring(template, "waiting", 4, {1: None}),
            "step 1 (tool, deferred) says nothing of what it waits for",
        ),
        "a wait that is not one": (
            deferring(template, "waiting", 4, {1: WAITS[6]}),
            "steps.1.wait: not a wait this harness stores",
        ),
        "a signal's wait with no name": (
            deferring(template, "running", 4, {1: WAITS[7]}),
            "steps.1.wait: not a wait this harness stores",
        ),
        "a deferred model step": (
            deferring(template, "waiting", 4, {0: CALLBACK}, deferred_from=1),
            "step 0 (model, deferred): a model step never defers",
        ),
        "a deferred call at the cursor": (
            deferring(template, "waiting", 3, {3: CALLBACK}, deferred_from=1),
            "step 3 (tool, deferred) is at the cursor 3",
        ),
        "a waiting run at a call, not its turn": (
            deferring(template, "waiting", 3, {1: CALLBACK}),
            "a waiting run's step at its cursor 3 is pending",
        ),
        "no mark where its turn looks": (
            deferring(template, "waiting", 4, {2: CALLBACK}, deferred_from=None),
            "step 2 (tool, deferred) waits, yet the run marks no deferred call",
        ),
        "a mark after a deferred call": (
            deferring(template, "running", 4, {1: CALLBACK, 3: SLEEP}, deferred_from=2),
            "step 1 (tool, deferred) is before deferred_from 2",
        ),
        "a mark on a model turn": (
            deferring(template, "running", 4, {2: CALLBACK}, deferred_from=0),
            "deferred_from 0 is not a call before the cursor 4",
        ),
    }
    for what, (doc, message) in refused.items():
        with pytest.raises(BadArchive) as raised:
            archive.import_run(sqlite_store, doc)
        assert message in str(raised.value), what
