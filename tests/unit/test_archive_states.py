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

Beside it: the gated call is never made more often than an operator here
approved it, whatever words the document carried.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness
from harness.engine import operations, recovery
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
ANY_STEP = ["pending", "in_doubt", "awaiting_approval", "failed", "running", "done"]
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


@st.composite
def documents(draw: st.DrawFn, template: dict[str, Any]) -> dict[str, Any]:
    """A variation of ``template``'s state, hashed as a forger would: any run
    status and cursor, any status at the cursor, maybe one other step out of
    place, maybe words on calls, maybe one value no deployment writes."""
    doc = copy.deepcopy(template)
    run, steps = doc["run"], doc["steps"]
    status = draw(st.sampled_from(RUN_STATUSES))
    cursor = draw(st.sampled_from(CURSORS))
    run.update(status=status, cursor=cursor)
    for step in steps:
        step["status"] = "done" if step["idx"] < cursor else "pending"
        step["approval"] = None
    if cursor < STEPS:
        usual = st.sampled_from(AT_CURSOR.get(status, ANY_STEP))
        steps[cursor]["status"] = draw(st.one_of(usual, st.sampled_from(ANY_STEP)))
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
    carried(sqlite_store, document, iter(lambda: data.draw(st.booleans()), None))


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
