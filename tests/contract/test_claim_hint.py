"""A step claimed on its message's hint, without a load (issue 13, item 2).

The worker that commits a model turn knows the run's new state, so the
message of the tool call that follows says it (:class:`ClaimHint`), and the
next worker writes the claim and reads the run in one statement. That claim
must be the one a load would have led to, and must land only in that state;
anything else is handled as a message without a hint. On both backends.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import harness
from harness.agents import get_agent
from harness.engine import transitions
from harness.engine.creation import create_run
from harness.engine.hints import ClaimHint
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import Run, RunStatus, StepStatus
from harness.store import ClaimGuard
from harness.store.sql import SQLStore
from tests.rig import Rig

CALLS: list[str] = []


@harness.tool(effect="idempotent")
def put(n: int, ctx: harness.ToolContext) -> int:
    CALLS.append(ctx.idempotency_key)
    return n


@harness.tool(effect="read_only")
def peek(n: int) -> int:
    return n


@harness.tool(effect="at_most_once")
def send(n: int) -> int:
    return n


@harness.tool(effect="idempotent", requires_approval=True)
def wire(n: int) -> int:
    return n


def _agent(name: str, calls: list[str], **kw: Any) -> str:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": tool, "args": {"n": i}}]} for i, tool in enumerate(calls)
    ]
    harness.register_agent(
        harness.Agent(
            name=name,
            model=harness.ScriptedModel([*turns, {"final": "done"}]),
            tools=[put, peek, send, wire],
            **kw,
        )
    )
    return name


class Loads:
    """The store, counting its loads."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store
        self.loads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def load(self, run_id: str, at: int | None = None) -> Run:
        self.loads += 1
        return self.store.load(run_id, at)


@pytest.fixture(autouse=True)
def _no_calls_yet() -> None:
    CALLS.clear()


@pytest.fixture
def counted(store: SQLStore) -> Loads:
    return Loads(store)


def _history(store: Any, run_id: str) -> list[tuple[Any, ...]]:
    events = [
        (e.version, e.step_index, e.from_status, e.to_status, e.detail)
        for e in store.events(run_id)
    ]
    steps = [(s.index, s.status, s.attempts, s.result) for s in store.steps(run_id)]
    return [*events, *steps]


def test_a_hinted_call_is_claimed_without_a_load_and_records_the_same_history(
    counted: Loads,
) -> None:
    agent = _agent("hint-same", ["put", "put", "put"])
    histories, loads = [], []
    for hints in (False, True):
        rig = Rig(counted, use_hints=hints)  # type: ignore[arg-type]
        counted.loads = 0
        run_id = create_run(rig.runtime(), agent, "g", run_id=f"r-{hints}")
        rig.drive()
        assert rig.load(run_id).status is RunStatus.COMPLETED
        loads.append(counted.loads - 1)  # less the check above
        histories.append(_history(counted, run_id))
    assert histories[0] == histories[1]
    assert loads == [7, 4]  # 7 steps; the 3 calls claimed on their hints
    assert CALLS == ["r-False:1", "r-False:3", "r-False:5", "r-True:1", "r-True:3", "r-True:5"]


class LostReply:
    """The store, whose claims on a hint commit, then answer as a connection
    that dropped as they committed does: with nothing."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def claim_loaded(self, claim: Any, guard: ClaimGuard) -> None:
        assert self.store.claim_loaded(claim, guard) is not None
        return None


def test_a_claim_whose_reply_was_lost_is_carried_on(store: SQLStore) -> None:
    """The load that follows finds the claim ours: the call executes now, once,
    as after a load path's claim that landed; no interruption is counted
    (with max_attempts=1 a counted one would fail the run)."""
    agent = _agent("hint-lost", ["put", "put"], max_attempts=1)
    histories = []
    for rig in (Rig(store, use_hints=False), Rig(LostReply(store))):  # type: ignore[arg-type]
        run_id = create_run(rig.runtime(), agent, "g", run_id=f"r{len(histories)}")
        assert rig.drive() == [TaskResult.ADVANCED] * 4 + [TaskResult.COMPLETED]
        histories.append(_history(store, run_id))
    assert histories[0] == histories[1]
    assert CALLS == ["r0:1", "r0:3", "r1:1", "r1:3"]


def _after_the_turn(store: Any, agent: str) -> tuple[Rig, str, ClaimHint]:
    """A run whose model turn has committed: its call's message, with its hint."""
    rig = Rig(store)
    run_id = create_run(rig.runtime(), agent, "g", run_id="r1")
    rig.sent.clear()
    assert run_step(rig.runtime(), run_id, 0) is TaskResult.ADVANCED
    hint = rig.hints[(run_id, 1)]
    return rig, run_id, hint


def test_a_redelivered_message_finds_its_hint_stale_and_writes_nothing(store: SQLStore) -> None:
    rig, run_id, hint = _after_the_turn(store, _agent("hint-stale", ["put"]))
    assert run_step(rig.runtime(), run_id, 1, hint) is TaskResult.ADVANCED
    before = _history(store, run_id)
    assert run_step(rig.runtime(), run_id, 1, hint) is TaskResult.STALE
    assert _history(store, run_id) == before


def test_a_pause_asked_beside_the_version_stops_the_claim(store: SQLStore) -> None:
    rig, run_id, hint = _after_the_turn(store, _agent("hint-pause", ["put"]))
    note = transitions.request_pause(store.load(run_id), who="op", now=rig.clock.now())
    assert not isinstance(note, transitions.Unchanged)
    store.request_pause(note)
    assert store.load(run_id).version == hint.version  # beside the version
    assert run_step(rig.runtime(), run_id, 1, hint) is TaskResult.PAUSED
    run = store.load(run_id)
    assert run.status is RunStatus.PAUSED
    assert run.current is not None and run.current.status is StepStatus.PENDING
    assert run.current.attempts == 0


def test_a_call_this_worker_holds_for_approval_is_not_claimed_on_the_hint(
    store: SQLStore,
) -> None:
    """A worker of a later deploy asks approval for a tool the sender did not."""
    rig, run_id, hint = _after_the_turn(store, _agent("hint-approve", ["put"]))
    gated = harness.tool(name="put", effect="idempotent", requires_approval=True)(put.fn)
    sender = get_agent("hint-approve")
    harness.register_agent(replace(sender, tools=[gated]))
    try:
        assert run_step(rig.runtime(), run_id, 1, hint) is TaskResult.WAITING
    finally:
        harness.register_agent(sender)
    run = store.load(run_id)
    assert run.status is RunStatus.WAITING and run.current is not None
    assert run.current.status is StepStatus.AWAITING_APPROVAL and CALLS == []


def test_a_hint_naming_an_agent_this_worker_lacks_is_ignored(store: SQLStore) -> None:
    rig, run_id, hint = _after_the_turn(store, _agent("hint-agent", ["put"]))
    assert run_step(rig.runtime(), run_id, 1, replace(hint, agent="absent")) is TaskResult.ADVANCED
    assert [e.detail for e in store.events(run_id) if e.to_status == "running"][-1] == "attempt 1"


@pytest.mark.parametrize(
    "wrong",
    [
        {"version": 1},  # the run moved on
        {"agent": "hint-other"},
        {"tool": "peek"},
        {"attempts": 1},
        {"cursor": 0},
    ],
)
def test_a_claim_lands_only_in_the_state_its_guard_names(
    store: SQLStore, wrong: dict[str, Any]
) -> None:
    _agent("hint-other", ["put"])
    wrong = dict(wrong)  # one dict per parameter, shared by both backends
    _, run_id, hint = _after_the_turn(store, _agent("hint-guard", ["put"]))
    before, events = store.load(run_id), store.events(run_id)
    guard = {"cursor": 1, "agent": hint.agent, "tool": hint.tool, "attempts": hint.attempts}
    version = wrong.pop("version", hint.version)
    guard |= wrong
    claim = transitions.claim_pending(
        run_id, version, guard["cursor"], guard["attempts"], worker="w/x", now=1.0, ttl=30.0
    )
    assert store.claim_loaded(claim, ClaimGuard(**guard)) is None
    assert store.load(run_id) == before
    assert store.events(run_id) == events


def test_a_claim_returns_the_run_as_a_load_found_it(store: SQLStore) -> None:
    _, run_id, hint = _after_the_turn(store, _agent("hint-returns", ["put"]))
    loaded = store.load(run_id)
    claim = transitions.claim_pending(
        run_id, hint.version, 1, hint.attempts, worker="w/x", now=2e6, ttl=30.0
    )
    claimed = store.claim_loaded(claim, ClaimGuard(1, hint.agent, hint.tool, hint.attempts))
    assert claimed == (loaded, hint.version + 1)
    # ...and wrote what a claim after that load writes
    after = store.load(run_id)
    assert (after.owner, after.lease_expires_at, after.version) == ("w/x", 2e6 + 30, 3)
    assert after.current is not None
    assert (after.current.status, after.current.attempts) == (StepStatus.RUNNING, 1)
    assert claim == transitions.claim(loaded, loaded.current, worker="w/x", now=2e6, ttl=30.0)  # type: ignore[arg-type]


def test_only_calls_of_idempotent_tools_free_to_run_get_a_hint(store: SQLStore) -> None:
    """read_only calls go straight through; at_most_once ones keep the load's
    care for a lost reply; calls needing approval wait; a deadline needs the run."""
    rig = Rig(store)
    run_id = create_run(rig.runtime(), _agent("hint-which", ["put", "peek", "send", "put"]), "g")
    hinted: list[int] = []
    while rig.sent:
        sent_run, cursor = rig.sent.pop(0)
        hint = rig.hints.pop((sent_run, cursor), None)
        if hint is not None:
            hinted.append(cursor)
        run_step(rig.runtime(), sent_run, cursor, hint)
    assert store.load(run_id).status is RunStatus.COMPLETED
    assert hinted == [1, 7]  # steps: 0 model, 1 put, 2 model, 3 peek, 4 model, 5 send, ...
    deadline = Rig(store)
    create_run(deadline.runtime(), _agent("hint-deadline", ["put"], deadline=3600.0), "g")
    deadline.drive()
    assert deadline.hints == {}


@pytest.mark.parametrize(
    "header",
    [
        None,
        7,
        "3,a,b,0",
        [3, "a", "b"],
        [3, "a", "b", "0"],
        ["3", "a", "b", 0],
        [3, 1, "b", 0],
        [True, "a", "b", 0],
        [2**31, "a", "b", 0],  # more than the store's version column holds
        [3, "a", "b", -1],
    ],
)
def test_a_header_that_is_not_a_hint_is_no_hint(header: object) -> None:
    assert ClaimHint.from_header(header) is None


def test_a_hint_survives_its_header() -> None:
    hint = ClaimHint(12, "agent", "tool", 0)
    assert ClaimHint.from_header(hint.header()) == hint
    assert ClaimHint.from_header(tuple(hint.header())) == hint


def test_a_lost_claim_found_lapsed_is_taken_over_like_any_lapsed_lease(store: SQLStore) -> None:
    """The reply was lost and the lease ran out before the load came back: the
    claim is ours no longer, and the ordinary takeover carries the call on."""
    rig, run_id, hint = _after_the_turn(store, _agent("hint-lapsed", ["put"]))

    class Slow(LostReply):
        def claim_loaded(self, claim: Any, guard: ClaimGuard) -> None:
            super().claim_loaded(claim, guard)
            rig.clock.advance(rig.lease_ttl + 1)

    rt = replace(rig.runtime(), store=Slow(store))  # type: ignore[arg-type]
    assert run_step(rt, run_id, 1, hint) is TaskResult.ADVANCED
    after = [e.to_status for e in store.events(run_id) if e.version > hint.version]
    assert after == ["running", "lease_takeover", "recovered_running", "running", "done"]
    assert [f"{run_id}:1"] == CALLS
