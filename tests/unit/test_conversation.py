"""Conversations, in process on the in-memory store: a completed run goes on
with the user's next message; a moving run gets it at its next model turn;
a final answer given while a message waits is steered on; each message is
made one step, once, in order, whoever races; the providers' transcripts
carry the user's turns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness
from harness.engine import conversation, operations
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.errors import DecisionConflict
from harness.providers.transcript import exchanges
from harness.records import RunStatus, StepKind, StepStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig
from tests.wire import WireServer

SEEN: list[list[tuple[str, str]]] = []


class Echo:
    """Answers each turn with what the conversation holds: the user's turns
    it has seen so far (``request.history()``), so a test reads what the
    model was given."""

    name = "test:echo"
    records_responses = False

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        while HOOKS:  # a user typing while the model answers
            HOOKS.pop()(request.run_id)
        said = [
            (s.kind.value, str(s.args.get("text")))
            for s in request.history()
            if s.kind is StepKind.USER and s.index < request.step_index
        ]
        SEEN.append(said)
        return harness.ModelTurn(final=f"turn {request.turn}: heard {len(said)}")


@harness.tool(effect="read_only")
def look(ctx: harness.ToolContext) -> str:
    while HOOKS:
        HOOKS.pop()(ctx.run_id)
    return "looked"


HOOKS: list[Any] = []

harness.register_agent(harness.Agent(name="c-echo", model=Echo(), tools=[]))
harness.register_agent(
    harness.Agent(
        name="c-looker",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "look", "args": {}}]},
                {"final": "done looking"},
                {"final": "answered the message"},
            ]
        ),
        tools=[look],
    )
)


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    SEEN.clear()
    HOOKS.clear()
    yield Rig(memory_store)


def test_a_completed_run_goes_on_with_the_next_message_three_times(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    for n, text in enumerate(["and then?", "why?", "thanks"], start=1):
        sent = conversation.send_message(rt, run_id, text)
        assert sent.outcome == "continued"
        assert rig.drive()[-1] is TaskResult.COMPLETED
        run = rig.load(run_id)
        assert (run.status, run.result) == (RunStatus.COMPLETED, f"turn {n}: heard {n}")
    steps = rig.store.steps(run_id)
    kinds = [s.kind.value for s in steps]
    assert kinds == ["model", "user", "model", "user", "model", "user", "model"]
    assert SEEN[-1] == [("user", "and then?"), ("user", "why?"), ("user", "thanks")]


def test_the_transcript_has_the_answers_and_the_users_turns_in_order(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    rig.drive()
    conversation.send_message(rt, run_id, "and then?")
    rig.drive()
    steps = rig.store.steps(run_id)
    said = exchanges(steps, before=len(steps))
    assert [(e.user, e.text) for e in said] == [
        (False, "turn 0: heard 0"),
        (True, "and then?"),
        (False, "turn 1: heard 1"),
    ]


def test_a_message_to_a_moving_run_comes_before_its_next_turn(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-looker", "look around")
    HOOKS.append(lambda run_id: conversation.send_message(rt, run_id, "look left too"))
    assert rig.drive()[-1] is TaskResult.COMPLETED
    steps = rig.store.steps(run_id)
    assert [(s.kind.value, s.status.value) for s in steps] == [
        ("model", "done"),
        ("tool", "done"),
        ("user", "done"),
        ("model", "done"),
    ]
    assert steps[2].args == {"text": "look left too"}
    assert rig.load(run_id).result == "done looking"  # the scripted turn 1
    assert rig.store.kept_signals(run_id) == []
    assert rig.load(run_id).inbox_at is None


def test_a_final_answer_while_a_message_waits_is_steered_on(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    # The message comes while the model is answering.
    HOOKS.append(lambda run_id: rt.store.keep_message(run_id, "one more thing", rig.clock.now()))
    assert rig.drive()[-1] is TaskResult.COMPLETED
    steps = rig.store.steps(run_id)
    assert [s.kind.value for s in steps] == ["model", "user", "model"]
    assert steps[0].status is StepStatus.DONE and steps[0].result["final"] == "turn 0: heard 0"
    events = [e for e in rig.store.events(run_id) if e.to_status == "completed"]
    assert len(events) == 1  # it never completed before the message was answered
    assert rig.load(run_id).result == "turn 1: heard 1"


def test_a_message_before_the_first_turn_is_taken_by_it(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    conversation.send_message(rt, run_id, "in a hurry")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    steps = rig.store.steps(run_id)
    assert [(s.index, s.kind.value) for s in steps] == [(0, "user"), (1, "model")]
    assert rig.load(run_id).result == "turn 0: heard 1"


def test_messages_are_ordered_and_each_taken_once_by_two_senders(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    rig.drive()
    # Two senders keep a message each before either continues the run.
    rt.store.keep_message(run_id, "first", rig.clock.now())
    rt.store.keep_message(run_id, "second", rig.clock.now())
    assert conversation.continue_completed(rt, run_id)
    count = rig.load(run_id).step_count
    # The second sender finds it moving on already: nothing more to do.
    assert not conversation.continue_completed(rig.runtime("w2"), run_id)
    assert rig.load(run_id).step_count == count
    rig.drive()
    users = [s.args["text"] for s in rig.store.steps(run_id) if s.kind is StepKind.USER]
    assert users == ["first", "second"]
    assert rig.store.kept_signals(run_id) == []


def test_a_message_kept_as_the_run_completed_continues_it(rig: Rig) -> None:
    """The sender saw the run moving; the runner had checked for messages
    before the sender kept its own: its look after completing continues it."""
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    real = conversation.steer

    def kept_after_the_check(rt_: Any, run: Any, step: Any, outcome: Any) -> Any:
        steered = real(rt_, run, step, outcome)  # looked: nothing waits yet
        rt.store.keep_message(run_id, "just in time", rig.clock.now())
        return steered

    conversation.steer = kept_after_the_check  # type: ignore[assignment]
    try:
        rig.drive(limit=1)
    finally:
        conversation.steer = real  # type: ignore[assignment]
    assert rig.load(run_id).status is RunStatus.RUNNING  # continued on completing
    rig.drive()
    users = [s.args["text"] for s in rig.store.steps(run_id) if s.kind is StepKind.USER]
    assert users == ["just in time"]


def test_a_failed_or_cancelled_run_refuses_a_message(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-looker", "look")
    operations.cancel(rt, run_id, "stop")
    with pytest.raises(DecisionConflict, match="cancelled"):
        conversation.send_message(rt, run_id, "hello?")
    assert rig.store.kept_signals(run_id) == []


def test_max_steps_counts_across_the_conversation_and_resume_raises_it(rig: Rig) -> None:
    harness.register_agent(
        harness.Agent(name="c-short", model=Echo(), tools=[], max_steps=3, on_budget="pause")
    )
    rt = rig.runtime()
    run_id = create_run(rt, "c-short", "hello")
    rig.drive()
    conversation.send_message(rt, run_id, "more")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED  # steps 0, 1, 2: within 3
    conversation.send_message(rt, run_id, "and more")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.PAUSED and "max_steps=3" in (run.error or "")
    operations.resume(rt, run_id, "op", max_steps=10)
    rig.drive()
    assert (rig.load(run_id).status, rig.load(run_id).max_steps) == (RunStatus.COMPLETED, 10)


def test_the_message_step_is_run_step_safe_to_redeliver(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    rig.drive()
    conversation.send_message(rt, run_id, "again")
    cursor = rig.load(run_id).cursor
    assert run_step(rt, run_id, cursor) is TaskResult.COMPLETED
    assert run_step(rt, run_id, cursor) in (TaskResult.NOT_MOVABLE, TaskResult.STALE)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_providers_are_sent_the_whole_conversation(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    """Through the real SDKs, against the local server that validates their
    wire format: the goal, the first answer, the user's message, in turn."""
    model = harness.OpenAIModel("gpt-test") if provider == "openai" else None
    model = model or harness.AnthropicModel("claude-test")
    harness.register_agent(harness.Agent(name=f"c-{provider}", model=model, tools=[]))
    wire.script("plan a trip", [{"text": "Where to?"}, {"text": "Oslo it is."}])
    rt = rig.runtime()
    run_id = create_run(rt, f"c-{provider}", "plan a trip")
    rig.drive()
    assert rig.load(run_id).result == "Where to?"
    conversation.send_message(rt, run_id, "Somewhere cold")
    rig.drive()
    assert rig.load(run_id).result == "Oslo it is."
    messages = wire.requests[-1].body["messages"]
    said = [(m["role"], _text(m["content"])) for m in messages if m["role"] != "system"]
    assert said == [
        ("user", "plan a trip"),
        ("assistant", "Where to?"),
        ("user", "Somewhere cold"),
    ]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content)


# -- what a race review of conversations found (each failed before its fix) -


class Flaky:
    """Fails its first call with a retryable error, then answers."""

    name = "test:flaky"
    records_responses = False

    def __init__(self) -> None:
        self.calls = 0

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        self.calls += 1
        if self.calls == 1:
            raise harness.RetryableModelError("503")
        return harness.ModelTurn(final=f"answered at step {request.step_index}")


def test_a_message_taken_at_a_rescheduled_turn_does_not_stall_the_run(rig: Rig) -> None:
    harness.register_agent(harness.Agent(name="c-flaky", model=Flaky(), tools=[]))
    rt = rig.runtime()
    run_id = create_run(rt, "c-flaky", "hello")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    conversation.send_message(rt, run_id, "hurry")
    assert rig.drive()[-1] is TaskResult.COMPLETED  # no sweep needed
    steps = rig.store.steps(run_id)
    assert [(s.kind.value, s.error, s.retries) for s in steps] == [
        ("user", None, 0),
        ("model", None, 0),
    ]


def test_a_message_left_behind_a_completed_run_by_dead_processes_is_taken_by_the_sweeper(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    rig.drive()
    rt.store.keep_message(run_id, "lost with its sender", rig.clock.now())  # then SIGKILL
    rig.clock.advance(rig.lease_ttl + 1)
    from harness.engine import recovery

    assert [s.reason for s in recovery.sweep(rt)] == ["a message waited"]
    assert rig.drive()[-1] is TaskResult.COMPLETED
    users = [s.args["text"] for s in rig.store.steps(run_id) if s.kind is StepKind.USER]
    assert users == ["lost with its sender"]
    # The sender's retry with its id is received once.
    rt.store.keep_message(run_id, "again", rig.clock.now(), "m-1")
    assert conversation.send_message(rt, run_id, "again", "m-1").outcome == "already"


def test_a_steered_message_has_its_event_and_a_replay_or_a_full_run_refuses_one(
    rig: Rig,
) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    HOOKS.append(lambda run_id: rt.store.keep_message(run_id, "also", rig.clock.now()))
    rig.drive()
    said = [e for e in rig.store.events(run_id) if e.detail == "the user's message"]
    assert [e.step_index for e in said] == [1]
    harness.register_agent(harness.Agent(name="c-two", model=Echo(), tools=[], max_steps=2))
    short = create_run(rt, "c-two", "hello")
    rig.drive()
    with pytest.raises(DecisionConflict, match="step limit"):
        conversation.send_message(rt, short, "more")


@pytest.mark.parametrize("tail", [conversation.TAIL, 0])
def test_a_message_reads_the_runs_last_steps_for_its_turn_not_the_whole_conversation(
    tail: int, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "c-echo", "hello")
    rig.drive()
    for text in [f"message {n}" for n in range(1, 13)]:
        conversation.send_message(rt, run_id, text)
        rig.drive()
    read: list[int] = []
    steps = rig.store.steps

    def counted(run_id: str, start: int = 0, limit: int | None = None) -> list[Any]:
        found = steps(run_id, start, limit)
        read.append(len(found))
        return found

    monkeypatch.setattr(conversation, "TAIL", tail)  # 0: no model step in the tail read
    monkeypatch.setattr(rig.store, "steps", counted)
    conversation.send_message(rt, run_id, "the last one")
    monkeypatch.undo()
    assert rig.drive()[-1] is TaskResult.COMPLETED
    run = rig.load(run_id)
    assert run.result == "turn 13: heard 13"
    last = rig.store.steps(run_id)[-1]
    assert (last.kind, last.args["turn"]) == (StepKind.MODEL, 13)
    # The run had 25 steps: a tail of 8, or every one when the tail has no model step.
    assert read == ([conversation.TAIL] if tail else [0, 25])
