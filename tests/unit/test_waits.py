"""Runs that wait on the world, in process on the in-memory store: deferred
calls answered by a completion, a callback or a signal (sent before or after
the wait), timeouts the model sees, durable sleeps, and child runs; each
answer taken once, whoever races it. tests/integration/test_waits_workers.py
does the same with real workers, brokers and SIGKILLs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

import harness
from harness import callbacks
from harness.engine import children, operations, recovery, waits
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.errors import BadInput, ConfigError, DecisionConflict, StoreError
from harness.records import RunStatus, StepStatus, WaitKind
from harness.store.memory import MemoryStore
from tests.rig import Rig

SECRET = "s" * 32
CALLED: list[str] = []
URLS: list[str] = []


@harness.tool(effect="idempotent")
def ship(parcel: str, ctx: harness.ToolContext) -> harness.Deferred:
    """Ask the courier to ship; it calls back."""
    CALLED.append(ctx.idempotency_key)
    URLS.append(ctx.callback_url())
    return harness.Deferred(timeout=3600)


@harness.tool(effect="idempotent")
def await_payment(ctx: harness.ToolContext) -> harness.Deferred:
    CALLED.append(ctx.idempotency_key)
    return harness.Deferred(timeout=60, signal="paid")


@harness.tool(effect="read_only")
def note(text: str) -> str:
    return text


def _agent(name: str, turns: list[dict[str, Any]], tools: list[Any], **kw: Any) -> str:
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=tools, **kw)
    )
    return name


def _calls(*names_args: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "args": a} for n, a in names_args]}


SHIPPER = _agent("u-shipper", [_calls(("ship", {"parcel": "p1"})), {"final": "shipped"}], [ship])
PAYER = _agent(
    "u-payer",
    [_calls(("await_payment", {}), ("note", {"text": "meanwhile"})), {"final": "paid"}],
    [await_payment, note],
)
SLEEPER = _agent(
    "u-sleeper",
    [_calls(("sleep", {"seconds": 600})), {"final": "rested"}],
    [harness.sleep_tool(max_seconds=3600)],
)
RESEARCHER = _agent("u-researcher", [{"final": "the answer is 42"}], [])
PLANNER = _agent(
    "u-planner",
    [
        _calls(("u-researcher", {"task": "find x"}), ("u-researcher2", {"task": "find y"})),
        {"final": "planned"},
    ],
    [harness.agent_tool("u-researcher"), harness.agent_tool("u-researcher", name="u-researcher2")],
)


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLED.clear()
    URLS.clear()
    yield Rig(memory_store, options={"callback_secret": SECRET, "public_url": "https://x.test"})


def _statuses(rig: Rig, run_id: str) -> list[str]:
    return [s.status.value for s in rig.store.steps(run_id)]


def test_a_deferred_call_frees_the_worker_and_a_callback_completes_it_once(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, SHIPPER, "ship p1")
    outcomes = rig.drive()
    assert outcomes[-1] is TaskResult.WAITING
    run = rig.load(run_id)
    assert run.status is RunStatus.WAITING and run.owner is None
    step = rig.store.steps(run_id, 1, 1)[0]
    assert step.status is StepStatus.DEFERRED
    assert step.wait is not None and step.wait.kind is WaitKind.CALLBACK
    (url,) = URLS
    assert url.startswith("https://x.test/api/callbacks/")
    token = url.rsplit("/", 1)[1]
    first = waits.callback(rt, token, {"tracking": "T1"}, None)
    assert first.delivery is waits.Delivery.ANSWERED
    again = waits.callback(rt, token, {"tracking": "T2"}, None)
    assert again.delivery is waits.Delivery.ALREADY and not again.changed
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert rig.store.steps(run_id, 1, 1)[0].result == {"tracking": "T1"}
    assert [f"{run_id}:1"] == CALLED


def test_a_forged_or_expired_token_is_refused(rig: Rig) -> None:
    rt = rig.runtime()
    create_run(rt, SHIPPER, "ship p1")
    rig.drive()
    token = URLS[0].rsplit("/", 1)[1]
    payload, signature = token.split(".")
    with pytest.raises(callbacks.BadToken):
        waits.callback(rt, f"{payload}.{signature[:-2]}AA", {}, None)
    with pytest.raises(callbacks.BadToken):
        waits.callback(rt, "not-a-token", {}, None)
    rig.clock.advance(31 * 24 * 3600)
    with pytest.raises(callbacks.ExpiredToken):
        waits.callback(rt, token, {}, None)


def test_callback_url_without_a_secret_is_a_config_error(memory_store: MemoryStore) -> None:
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), SHIPPER, "ship")
    rig.drive()
    step = memory_store.steps(run_id, 1, 1)[0]
    assert step.status is StepStatus.FAILED
    assert "HARNESS_CALLBACK_SECRET" in (step.error or "")


def test_a_signal_sent_before_the_wait_is_kept_and_taken_once(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PAYER, "wait for payment")
    rig.drive(limit=1)  # the model turn: the calls are queued, none made
    sent = waits.signal(rt, run_id, "paid", {"amount": 5}, signal_id="tx-1")
    assert sent.delivery is waits.Delivery.KEPT
    again = waits.signal(rt, run_id, "paid", {"amount": 5}, signal_id="tx-1")
    assert again.delivery is waits.Delivery.ALREADY
    assert rig.drive()[-1] is TaskResult.COMPLETED
    steps = rig.store.steps(run_id)
    assert steps[1].result == {"amount": 5}
    assert rig.store.kept_signals(run_id) == []


def test_a_signal_after_the_wait_answers_the_oldest_step_on_it(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PAYER, "wait for payment")
    assert rig.drive()[-1] is TaskResult.WAITING
    # the other call of the turn went on while the first waited
    assert _statuses(rig, run_id)[:3] == ["done", "deferred", "done"]
    answered = waits.signal(rt, run_id, "paid", {"amount": 7})
    assert (answered.delivery, answered.step) == (waits.Delivery.ANSWERED, 1)
    assert rig.drive()[-1] is TaskResult.COMPLETED


def test_a_timeout_is_an_error_the_model_sees(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PAYER, "wait for payment")
    rig.drive()
    rig.clock.advance(61)
    sent = recovery.sweep(rt)
    assert [(s.run_id, s.reason) for s in sent] == [(run_id, "its wait is over")]
    assert rig.drive()[-1] is TaskResult.COMPLETED
    step = rig.store.steps(run_id, 1, 1)[0]
    assert step.status is StepStatus.FAILED
    assert step.error is not None and step.error.startswith("no answer within 60 s")
    # a completion after the timeout lost the race: it changes nothing
    late = waits.complete(rt, run_id, 1, result={"amount": 1}, by="late")
    assert late.delivery is waits.Delivery.ALREADY


def test_a_durable_sleep_wakes_after_its_time(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, SLEEPER, "rest")
    assert rig.drive()[-1] is TaskResult.WAITING
    rig.clock.advance(300)
    assert recovery.sweep(rt) == []
    rig.clock.advance(301)
    assert len(recovery.sweep(rt)) == 1
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert rig.store.steps(run_id, 1, 1)[0].result == {"slept": 600}


def test_a_completion_of_a_call_under_way_is_kept_until_it_defers(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, SHIPPER, "ship")
    rig.drive(limit=1)
    early = waits.complete(rt, run_id, 1, result={"fast": True}, by="courier")
    assert early.delivery is waits.Delivery.KEPT
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert rig.store.steps(run_id, 1, 1)[0].result == {"fast": True}


def test_children_run_in_parallel_once_and_answer_their_parent(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PLANNER, "plan")
    outcomes = rig.drive()
    assert outcomes[-1] is TaskResult.COMPLETED
    parent = rig.load(run_id)
    assert parent.status is RunStatus.COMPLETED
    children = rig.store.children(run_id)
    assert [c.run_id for c in children] == [f"{run_id}:1", f"{run_id}:2"]
    assert all(c.parent is not None and c.parent.run_id == run_id for c in children)
    steps = rig.store.steps(run_id)
    assert steps[1].result == "the answer is 42" and steps[2].result == "the answer is 42"


def _drive_only(rig: Rig, run_id: str) -> list[TaskResult]:
    """Deliver the messages of ``run_id`` alone; the others stay queued."""
    outcomes = []
    while any(r == run_id for r, _ in rig.sent):
        message = next(m for m in rig.sent if m[0] == run_id)
        rig.sent.remove(message)
        outcomes.append(run_step(rig.runtime(), *message))
    return outcomes


def test_cancelling_a_parent_cancels_its_children(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PLANNER, "plan")
    assert _drive_only(rig, run_id)[-1] is TaskResult.WAITING  # children created, not run
    assert [c.status for c in rig.store.children(run_id)] == [RunStatus.PENDING] * 2
    operations.cancel(rt, run_id, "stop")
    assert [c.status for c in rig.store.children(run_id)] == [RunStatus.CANCELLED] * 2
    with pytest.raises(DecisionConflict):
        waits.signal(rt, run_id, "x")
    rig.drive()  # the children's messages find them cancelled
    assert rig.load(run_id).status is RunStatus.CANCELLED


def test_a_child_is_started_once_and_its_budget_is_its_parents_rest(rig: Rig) -> None:
    name = _agent(
        "u-budgeted",
        [_calls(("u-researcher", {"task": "find x"})), {"final": "done"}],
        [harness.agent_tool("u-researcher")],
        max_tokens=1000,
    )
    rt = rig.runtime()
    run_id = create_run(rt, name, "plan")
    _drive_only(rig, run_id)
    (child,) = rig.store.children(run_id)
    assert child.max_tokens == 1000  # scripted turns report no usage
    # the step's call again (a redelivery after a crash): the same child, not a second
    hooks = children.Hooks(rt)
    ctx = harness.ToolContext(run_id, 1, 2, hooks)
    assert ctx.start_child("u-researcher", "find x").child == child.run_id
    assert len(rig.store.children(run_id)) == 1


def test_no_secret_config_error_is_clear() -> None:
    with pytest.raises(ConfigError, match="HARNESS_CALLBACK_SECRET"):
        callbacks.sign(None, callbacks.CallbackClaim("r", 1, 1, 0.0))


# -- what a review of the first version found (each failed before its fix) ---


class Metered:
    """A scripted model that reports usage: ``usage`` tokens in, 1 out, each turn."""

    records_responses = False

    def __init__(self, turns: list[dict[str, Any]], usage: int) -> None:
        self.scripted = harness.ScriptedModel(turns)
        self.usage = usage

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        turn = self.scripted.next_turn(request)
        return harness.ModelTurn(
            final=turn.final, tool_calls=turn.tool_calls, usage=harness.Usage(self.usage, 1)
        )


harness.register_agent(
    harness.Agent(name="u-metered-child", model=Metered([{"final": "42"}], 100), tools=[])
)
harness.register_agent(
    harness.Agent(
        name="u-metered-parent",
        model=Metered(
            [_calls(("u-metered-child", {"task": "x"}), ("note", {"text": "t"})), {"final": "ok"}],
            1,
        ),
        tools=[harness.agent_tool("u-metered-child"), note],
    )
)


def test_a_childs_usage_collected_by_the_parents_turn_is_kept(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "u-metered-parent", "plan")
    _drive_only(rig, run_id)  # the turn and the child's call; waits at the next turn
    # The child ends, and its process dies before it answers the parent.
    monkeypatch.setattr(children, "child_ended", lambda rt, child_id: None)
    _drive_only(rig, f"{run_id}:1")
    monkeypatch.undo()
    rig.clock.advance(rig.lease_ttl + 1)  # the sweeper's look at the waiting parent
    recovery.sweep(rt)
    _drive_only(rig, run_id)
    parent = rig.load(run_id)
    assert parent.status is RunStatus.COMPLETED
    assert parent.input_tokens == 1 + 100 + 1  # its two turns and the child's one


def test_a_signal_whose_sender_died_before_giving_it_to_its_step_is_given_by_the_sweeper(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PAYER, "wait for payment")
    rig.drive()
    real = waits.take_kept

    def dies(rt: Any, run_id: str) -> dict[int, int]:
        raise StoreError("connection reset")

    monkeypatch.setattr(waits, "take_kept", dies)
    with pytest.raises(StoreError):
        waits.signal(rt, run_id, "paid", {"amount": 1}, signal_id="tx-1")
    monkeypatch.setattr(waits, "take_kept", real)
    rig.clock.advance(1)  # the kept signal marked the run due
    assert [s.run_id for s in recovery.sweep(rt)] == [run_id]
    assert rig.drive()[-1] is TaskResult.COMPLETED
    # The sender's retry is the same signal: received once.
    again = waits.signal(rt, run_id, "paid", {"amount": 1}, signal_id="tx-1")
    assert again.delivery is waits.Delivery.ALREADY


@harness.tool(effect="read_only")
def boom() -> str:
    raise ValueError("boom")


FAILING_PARENT = _agent(
    "u-failing-parent",
    [_calls(("u-sleepy-child", {"task": "x"}), ("boom", {})), {"final": "never"}],
    [harness.agent_tool("u-sleepy-child"), boom],
    on_tool_error="fail",
)
SLEEPY_CHILD = _agent(
    "u-sleepy-child",
    [_calls(("sleep", {"seconds": 3000})), {"final": "c"}],
    [harness.sleep_tool(max_seconds=3600)],
)


def test_a_parent_that_fails_cancels_its_children(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), FAILING_PARENT, "plan")
    _drive_only(rig, run_id)
    assert rig.load(run_id).status is RunStatus.FAILED
    assert [c.status for c in rig.store.children(run_id)] == [RunStatus.CANCELLED]


HOLD: dict[str, Any] = {}


@harness.tool(effect="idempotent")
def spawn_after_cancel(ctx: harness.ToolContext) -> harness.Deferred:
    operations.cancel(HOLD["rt"], ctx.run_id, "stop")  # lands while this call is under way
    return ctx.start_child(SLEEPY_CHILD, "x")


RACED_PARENT = _agent(
    "u-raced-parent", [_calls(("spawn_after_cancel", {})), {"final": "p"}], [spawn_after_cancel]
)


def test_a_cancel_racing_a_childs_start_leaves_no_child_going(rig: Rig) -> None:
    rt = rig.runtime()
    HOLD["rt"] = rt
    run_id = create_run(rt, RACED_PARENT, "plan")
    _drive_only(rig, run_id)
    assert rig.load(run_id).status is RunStatus.CANCELLED
    assert all(c.status is RunStatus.CANCELLED for c in rig.store.children(run_id))


def test_an_answered_run_whose_worker_died_before_waking_it_wakes_within_a_ttl(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, SHIPPER, "ship")
    real = waits.transitions.await_deferred

    def answered_meanwhile(run: Any, waiting: Any, **kw: Any) -> Any:
        waits.complete(rt, run_id, 1, result={"ok": 1}, by="courier")  # before the wait lands
        return real(run, waiting, **kw)

    monkeypatch.setattr(waits.transitions, "await_deferred", answered_meanwhile)
    monkeypatch.setattr(waits, "take_kept", lambda rt, run_id: {})  # the worker dies here
    monkeypatch.setattr(waits, "wake_if_ready", lambda rt, run_id: None)
    rig.drive()
    monkeypatch.undo()
    assert rig.load(run_id).status is RunStatus.WAITING
    rig.clock.advance(rig.lease_ttl + 1)
    assert [s.run_id for s in recovery.sweep(rt)] == [run_id]
    assert rig.drive()[-1] is TaskResult.COMPLETED


VICTIM: dict[str, str] = {}


@harness.tool(effect="read_only")
def relay() -> dict[str, Any]:
    """Relays JSON from outside, which happens to look like a recorded wait."""
    return {"__harness_wait__": {"kind": "child", "child": VICTIM["id"]}}


RELAYER = _agent("u-relayer", [_calls(("relay", {})), {"final": "p"}], [relay])


def test_a_result_shaped_as_a_wait_is_refused_not_obeyed(rig: Rig) -> None:
    rt = rig.runtime()
    VICTIM["id"] = create_run(rt, RESEARCHER, "secret")
    rig.drive()
    run_id = create_run(rt, RELAYER, "relay")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    step = rig.store.steps(run_id, 1, 1)[0]
    assert step.status is StepStatus.FAILED and "reserved for the harness" in (step.error or "")
    with pytest.raises(BadInput):
        harness.api.Operator().signal(run_id, "x", {"__harness_wait__": {}})


def test_completing_a_childs_wait_by_hand_is_refused(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PLANNER, "plan")
    _drive_only(rig, run_id)
    with pytest.raises(DecisionConflict, match="waits on child run"):
        waits.complete(rt, run_id, 1, result="mine", by="me")
    operations.cancel(rt, f"{run_id}:2", "gone")  # ended: its answer may be given by hand
    assert waits.complete(rt, run_id, 2, result="mine", by="me").delivery.value == "already"


def test_a_long_wait_costs_the_sweeper_one_look_then_none_until_its_time(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, SHIPPER, "ship")  # a callback, an hour's timeout
    rig.drive()
    rig.clock.advance(rig.lease_ttl + 1)
    assert [r.run_id for r in rig.store.due_waits(rig.clock.now())] == [run_id]
    assert recovery.sweep(rt) == []  # looked at: nothing came, nothing due
    for _ in range(10):
        rig.clock.advance(300)
        assert rig.store.due_waits(rig.clock.now()) == []
    rig.clock.advance(3600)
    assert [s.run_id for s in recovery.sweep(rt)] == [run_id]  # its timeout


@pytest.mark.parametrize("token", ["é.x", "\u2603abc.def", "a.\udcff"])
def test_a_token_that_is_not_ascii_is_a_bad_token_not_a_crash(token: str) -> None:
    with pytest.raises(callbacks.BadToken):
        callbacks.verify(SECRET, token, 0.0)


def test_a_run_waiting_on_its_calls_is_told_from_one_waiting_on_an_operator(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, SHIPPER, "ship")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.WAITING and run.waits_on_calls  # `harness wait` goes on
    tool_step = rig.store.steps(run_id, 1, 1)[0]
    approval = replace(run, current=replace(tool_step, status=StepStatus.AWAITING_APPROVAL))
    assert not approval.waits_on_calls  # an operator's to act on: `harness wait` returns


# -- what a review of the doors found (each failed before its fix) -----------


def test_a_signal_may_not_pass_for_a_steps_own_early_answer(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, PLANNER, "plan")
    _drive_only(rig, run_id)
    with pytest.raises(BadInput, match="may not start with '@'"):
        harness.api.Operator().signal(run_id, "@step:1", "mine")
    assert rig.load(run_id).status is RunStatus.WAITING


@harness.tool(effect="idempotent")
def claim_another(ctx: harness.ToolContext) -> harness.Deferred:
    """Waits on a child run it did not start (the field is public)."""
    return harness.Deferred(child=VICTIM["id"])


CLAIMER = _agent("u-claimer", [_calls(("claim_another", {})), {"final": "p"}], [claim_another])


def test_a_step_takes_the_end_only_of_the_child_it_started(rig: Rig) -> None:
    rt = rig.runtime()
    VICTIM["id"] = create_run(rt, RESEARCHER, "secret")
    rig.drive()
    run_id = create_run(rt, CLAIMER, "claim")
    assert rig.drive()[-1] is TaskResult.WAITING
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rt)
    rig.drive()
    step = rig.store.steps(run_id, 1, 1)[0]
    assert step.status is StepStatus.DEFERRED and step.result is None  # not the other's answer


def test_an_empty_error_and_a_bad_expiry_are_refused(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, SHIPPER, "ship")
    rig.drive()
    with pytest.raises(BadInput, match="empty"):
        harness.api.Operator().complete(run_id, 1, error=" ")
    ctx = harness.ToolContext(run_id, 1, 1, children.Hooks(rt))
    for bad in (float("inf"), float("nan"), -1, 0):
        with pytest.raises(BadInput, match="expires_in"):
            ctx.callback_url(expires_in=bad)
