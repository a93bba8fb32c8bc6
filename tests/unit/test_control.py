"""Operator control on the embedded store: budgets that stop a run before the
call that would exceed them, approvals acted on once, pause, resume, cancel.

The runner executes in-process (no worker consumes the embedded broker
here); each test moves the run with ``run_step`` or ``drive``, as a worker
would. tests/integration/test_control_workers.py does the same with real
workers and a SIGKILL between an approval and its call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness
from harness import api
from harness.cli import main
from harness.engine import transitions
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.errors import BadInput, DecisionConflict, InvalidToolArgs, OperatorError
from harness.records import RunStatus, StepStatus
from tests.wire import WireServer

made: list[tuple[str, Any]] = []
hooks: list[Any] = []  # called inside a tool call: an operator acting mid-step


@harness.tool(effect="idempotent", requires_approval=True)
def pay(amount: int, ctx: harness.ToolContext) -> dict[str, Any]:
    """Pay someone."""
    made.append((ctx.idempotency_key, amount))
    return {"paid": amount}


@harness.tool(effect="idempotent")
def work(n: int, ctx: harness.ToolContext) -> int:
    made.append((ctx.idempotency_key, n))
    while hooks:
        hooks.pop()(ctx.run_id)
    return n


class Metered:
    """A model that reports usage and reserves a fixed output limit, like a
    provider's, but deterministic: each turn uses 100 in, 50 out."""

    name = "test:metered"
    records_responses = False

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.scripted = harness.ScriptedModel(turns)

    def reserve(self, request: harness.ModelRequest) -> harness.Usage:
        return harness.Usage(100, 50)

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        turn = self.scripted.next_turn(request)
        return harness.ModelTurn(
            final=turn.final, tool_calls=turn.tool_calls, usage=harness.Usage(100, 50)
        )


WORK_TWICE = [
    {"tool_calls": [{"name": "work", "args": {"n": 1}}]},
    {"tool_calls": [{"name": "work", "args": {"n": 2}}]},
    {"final": "worked"},
]


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_PRICES", '{"test:metered": {"input": 1000, "output": 2000}}')
    api.reset_runtime()
    made.clear()
    hooks.clear()
    yield
    api.reset_runtime()


def agent(name: str, model: Any, **options: Any) -> str:
    harness.register_agent(harness.Agent(name=name, model=model, tools=[pay, work], **options))
    return name


def drive(run_id: str, limit: int = 20) -> list[TaskResult]:
    """Step the run as workers would, until it stops moving."""
    outcomes = []
    for _ in range(limit):
        outcome = run_step(api.runtime(), run_id)
        outcomes.append(outcome)
        if outcome is not TaskResult.ADVANCED:
            break
    return outcomes


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


# Budgets --------------------------------------------------------------------


def test_a_token_budget_stops_the_run_before_the_call_that_would_exceed_it() -> None:
    # Each turn uses 150 and reserves 150: after two turns (300), a third needs 450 > 400.
    run_id = api.start_run(agent("tok", Metered(WORK_TWICE), max_tokens=400), "g")
    assert drive(run_id)[-1] is TaskResult.FAILED
    run = api.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert (
        run.error
        == "token budget: 300 used + 150 reserved for the next model call > max_tokens=400"
    )
    assert (run.input_tokens, run.output_tokens) == (200, 100)  # never over the budget
    assert [s.status for s in api.get_steps(run_id)][-1] is StepStatus.PENDING  # never called


def test_a_cost_budget_pauses_the_run_and_resume_raises_it() -> None:
    # $0.1 + $0.1 per turn at these prices: the third turn would reach $0.6 > $0.5.
    name = agent("cost", Metered(WORK_TWICE), max_cost_usd=0.5, on_budget="pause")
    run_id = api.start_run(name, "g")
    assert drive(run_id)[-1] is TaskResult.PAUSED
    paused = api.get_run(run_id)
    assert paused.status is RunStatus.PAUSED
    assert paused.error is not None and paused.error.startswith("cost budget: $0.400000 spent")
    assert (
        run_step(api.runtime(), run_id) is TaskResult.NOT_MOVABLE
    )  # a stray message moves nothing

    code, out = cli("resume", run_id, "--max-cost-usd", "1", "--by", "alice")
    assert code == 0, out
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    done = api.get_run(run_id)
    assert (done.status, done.max_cost_usd) == (RunStatus.COMPLETED, 1.0)
    assert done.cost_usd == pytest.approx(0.6)
    resumed = [e for e in api.reads().store.events(run_id) if e.from_status == "paused"]
    assert [(e.worker, e.detail) for e in resumed] == [
        ("alice", "resumed by alice; budget set: max_cost_usd=1")
    ]


def test_a_cost_budget_without_a_price_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_PRICES", "")
    api.reset_runtime()
    run_id = api.start_run(agent("unpriced", Metered(WORK_TWICE), max_cost_usd=1.0), "g")
    drive(run_id)
    assert api.get_run(run_id).error == UNPRICED


UNPRICED = (
    "max_cost_usd is set, but HARNESS_PRICES has no price for 'test:metered': the cost "
    "budget cannot be measured (no call was made)"
)


def test_a_cost_budget_that_cannot_be_measured_fails_even_where_a_budget_pauses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No price: a setting to fix, not a budget to raise. Pausing would only
    pause again after every resume."""
    monkeypatch.setenv("HARNESS_PRICES", "")
    api.reset_runtime()
    name = agent("unpriced-pause", Metered(WORK_TWICE), max_cost_usd=1.0, on_budget="pause")
    run_id = api.start_run(name, "g")
    assert drive(run_id)[-1] is TaskResult.FAILED
    run = api.get_run(run_id)
    assert (run.status, run.error) == (RunStatus.FAILED, UNPRICED)
    assert made == []


def test_resuming_with_a_cost_budget_on_an_unpriced_model_ends_the_run_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HARNESS_PRICES", "")
    api.reset_runtime()
    name = agent("tokens-pause", Metered(WORK_TWICE), max_tokens=400, on_budget="pause")
    run_id = api.start_run(name, "g")
    assert drive(run_id)[-1] is TaskResult.PAUSED  # its token budget
    code, out = cli("resume", run_id, "--max-tokens", "10000", "--max-cost-usd", "1")
    assert code == 0, out
    assert drive(run_id) == [TaskResult.FAILED]  # not paused again, and again after each resume
    assert api.get_run(run_id).error == UNPRICED


def test_a_provider_run_stops_before_the_call_its_reservation_does_not_fit(
    wire: WireServer,
) -> None:
    """The reservation of a real provider's call: its request, estimated, plus
    its max_tokens. The server sees turn 0 and never turn 1."""
    model = harness.OpenAIModel("gpt-test", max_tokens=100)
    wire.script(
        "spend",
        [
            {
                "tool_calls": [{"name": "work", "args": {"n": 1}}],
                "usage": {"input_tokens": 80, "output_tokens": 20},
            },
            {"text": "never"},
        ],
    )
    # Turn 0 reserves about 240 tokens and fits; turn 1 (100 used, a longer
    # request) does not.
    run_id = api.start_run(agent("prov", model, max_tokens=300), "spend")
    drive(run_id)
    run = api.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert run.error is not None and run.error.startswith("token budget: 100 used + ")
    assert (wire.calls("spend", 0), wire.calls("spend", 1)) == (1, 0)


def test_budgets_are_checked_when_the_agent_is_made() -> None:
    with pytest.raises(ValueError, match="on_budget"):
        harness.Agent(name="x", model=Metered([]), on_budget="ask")
    with pytest.raises(ValueError, match="max_cost_usd"):
        harness.Agent(name="x", model=Metered([]), max_cost_usd=0)


# Approval -------------------------------------------------------------------

BATCH = [
    {
        "tool_calls": [
            {"name": "pay", "args": {"amount": 10}},
            {"name": "pay", "args": {"amount": 20}},
            {"name": "pay", "args": {"amount": 30}},
        ]
    },
    {"final": "paid"},
]


def test_a_call_waits_for_approval_with_its_arguments_shown() -> None:
    run_id = api.start_run(agent("one", harness.ScriptedModel(BATCH[:1] + BATCH[1:])), "g")
    assert drive(run_id)[-1] is TaskResult.WAITING
    run = api.get_run(run_id)
    assert run.status is RunStatus.WAITING
    step = api.get_steps(run_id)[1]
    assert (step.status, step.args) == (StepStatus.AWAITING_APPROVAL, {"amount": 10})
    code, out = cli("show", run_id)
    assert "awaiting_approval" in out and 'args: {"amount": 10}' in out
    code, out = cli("wait", run_id, "--timeout", "1")
    assert code == 0 and "waiting" in out  # held for an operator: wait returns
    assert run_step(api.runtime(), run_id) is TaskResult.NOT_MOVABLE
    assert made == []


def test_each_call_of_a_batch_is_decided_on_its_own_and_acted_on_once() -> None:
    run_id = api.start_run(agent("batch", harness.ScriptedModel(BATCH)), "g")
    drive(run_id)  # waits on step 1
    # Ahead of time, for the later calls; then the one the run waits on.
    code, out = cli("reject", run_id, "--step", "3", "--reason", "too much", "--by", "bob")
    assert code == 0 and "step 3 rejected by bob" in out, out
    harness.approve(run_id, step=2, args={"amount": 25}, by="alice")
    code, out = cli("approve", run_id, "--by", "alice")
    assert code == 0 and "step 1 approved by alice" in out, out
    # Another word changes nothing, and says so: the first stands.
    code, out = cli("approve", run_id, "--step", "3", "--by", "mallory")
    assert code == 1, out
    assert "step 3 was already rejected by bob (too much); nothing changed" in out

    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert made == [(f"{run_id}:1", 10), (f"{run_id}:2", 25)]
    steps = api.get_steps(run_id)
    assert [s.status for s in steps[1:4]] == [StepStatus.DONE, StepStatus.DONE, StepStatus.FAILED]
    assert steps[3].error == "rejected by bob: too much"
    assert steps[2].approval is not None and steps[2].approval.proposed_args == {"amount": 20}
    history = [(e.to_status, e.worker, e.step_index) for e in api.reads().store.events(run_id)]
    assert ("rejected", "bob", 3) in history
    assert ("approved", "alice", 2) in history and ("approved", "alice", 1) in history
    assert not any(worker == "mallory" for _, worker, _ in history)


def test_approving_twice_from_python_is_a_no_op() -> None:
    run_id = api.start_run(agent("twice", harness.ScriptedModel(BATCH)), "g")
    drive(run_id)
    first = harness.approve(run_id, by="alice")
    version = first.version
    again = harness.approve(run_id, step=1, by="bob")
    assert again.version == version
    word = api.get_steps(run_id)[1].approval
    assert word is not None and word.by == "alice"


def test_a_rejection_is_told_to_the_model(wire: WireServer) -> None:
    wire.script(
        "refund",
        [{"tool_calls": [{"name": "pay", "args": {"amount": 5}}]}, {"text": "understood"}],
    )
    run_id = api.start_run(agent("told", harness.OpenAIModel("gpt-test")), "refund")
    drive(run_id)
    harness.reject(run_id, "not today", by="carol")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    answer = next(m for m in wire.requests[-1].body["messages"] if m["role"] == "tool")
    assert json.loads(answer["content"]) == {"error": "rejected by carol: not today"}
    assert made == []


def test_edited_arguments_the_tool_would_refuse_are_refused_to_the_operator() -> None:
    run_id = api.start_run(agent("edit", harness.ScriptedModel(BATCH)), "g")
    drive(run_id)
    with pytest.raises(InvalidToolArgs, match="amount"):
        harness.approve(run_id, args={"amount": "lots"})
    code, out = cli("approve", run_id, "--args", "[1]")
    assert code == 2 and "must be a JSON object" in out
    assert api.get_steps(run_id)[1].approval is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("approve", "{run}"), "no call awaiting approval"),
        (("approve", "{run}", "--step", "0"), "no tool call at step 0"),
        (("resume", "{run}", "--max-tokens", "5"), "not paused"),
        (("approve", "nope"), "no run with id 'nope'"),
    ],
)
def test_operator_mistakes_are_one_line_errors(args: tuple[str, ...], message: str) -> None:
    run_id = api.start_run(agent("oops", Metered(WORK_TWICE)), "g")
    code, out = cli(*(a.format(run=run_id) for a in args))
    assert code == 1 and message in out and "Traceback" not in out


# Pause, resume, cancel -----------------------------------------------------


def test_a_pause_during_a_step_lets_it_finish_then_holds_the_run() -> None:
    run_id = api.start_run(agent("pausing", Metered(WORK_TWICE)), "g")
    hooks.append(lambda rid: harness.pause_run(rid, by="dave"))
    outcomes = drive(run_id)
    assert outcomes[-1] is TaskResult.PAUSED
    steps = api.get_steps(run_id)
    assert (steps[1].status, steps[1].result) == (StepStatus.DONE, 1)  # recorded, not fenced
    assert steps[2].status is StepStatus.PENDING and len(made) == 1
    assert api.get_run(run_id).status is RunStatus.PAUSED
    code, out = cli("resume", run_id)
    assert code == 0 and "running" in out
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert [key for key, _ in made] == [f"{run_id}:1", f"{run_id}:3"]


def test_a_pause_during_a_wait_takes_effect_once_the_run_moves() -> None:
    run_id = api.start_run(agent("pause-wait", harness.ScriptedModel(BATCH)), "g")
    drive(run_id)  # awaiting approval
    code, out = cli("pause", run_id, "--by", "erin")
    assert code == 0 and "pauses at its next step boundary" in out
    assert api.get_run(run_id).pause_requested
    harness.approve(run_id, by="erin")
    assert drive(run_id) == [TaskResult.PAUSED]
    assert made == []  # the approved call waits for the resume
    harness.resume_run(run_id)
    assert drive(run_id)[-1] is TaskResult.WAITING  # the next call of the batch
    assert made == [(f"{run_id}:1", 10)]


def test_resume_withdraws_a_pause_not_reached_yet() -> None:
    run_id = api.start_run(agent("withdraw", Metered(WORK_TWICE)), "g")
    harness.pause_run(run_id)
    assert harness.resume_run(run_id).pause_requested is False
    assert drive(run_id)[-1] is TaskResult.COMPLETED


def test_cancel_during_a_wait_and_nothing_after() -> None:
    run_id = api.start_run(agent("cancel-wait", harness.ScriptedModel(BATCH)), "g")
    drive(run_id)
    code, out = cli("cancel", run_id)
    assert code == 0 and "cancelled" in out
    with pytest.raises(DecisionConflict, match="has been cancelled; nothing changed"):
        harness.approve(run_id)
    assert run_step(api.runtime(), run_id) is TaskResult.NOT_MOVABLE
    assert made == []


def test_cancel_during_a_step_records_nothing_after() -> None:
    run_id = api.start_run(agent("cancel-step", Metered(WORK_TWICE)), "g")
    hooks.append(lambda rid: harness.cancel_run(rid))
    assert drive(run_id)[-1] is TaskResult.CANCELLED
    assert api.get_run(run_id).status is RunStatus.CANCELLED
    assert [s.status for s in api.get_steps(run_id)][1] is StepStatus.RUNNING
    assert run_step(api.runtime(), run_id) is TaskResult.NOT_MOVABLE
    assert len(made) == 1


def test_pausing_a_run_waiting_for_its_provider_holds_it_at_once() -> None:
    run_id = api.start_run(agent("pause-retry", Metered(WORK_TWICE)), "g")
    rt = api.runtime()
    run = rt.store.load(run_id)
    assert run.current is not None
    rt.store.checkpoint(
        transitions.reschedule(
            run,
            run.current,
            transitions.Reschedule(600, "HTTP 429", retry=True),
            version=run.version,
            worker="w",
            now=rt.clock.now(),
            claimed=False,
        )
    )
    harness.pause_run(run_id)
    assert run_step(rt, run_id) is TaskResult.PAUSED  # the message the pause sent


def test_a_word_noted_as_the_run_reached_the_call_is_acted_on() -> None:
    """The race: an operator decides a later call ahead (beside the version)
    just as the runner, having loaded the run before, makes it wait for that
    call. The next approve acts on the word already there, once."""
    run_id = api.start_run(agent("race", harness.ScriptedModel(BATCH)), "g")
    drive(run_id)
    harness.approve(run_id, by="alice")
    assert run_step(api.runtime(), run_id) is TaskResult.ADVANCED  # call 1 made
    rt = api.runtime()
    loaded = rt.store.load(run_id)  # the runner's view: call 2 not decided yet
    assert loaded.current is not None and loaded.current.approval is None
    harness.approve(run_id, step=2, by="bob")  # noted ahead...
    rt.store.checkpoint(  # ...as the runner's wait lands on the run it loaded
        transitions.await_approval(loaded, loaded.current, worker="w", now=rt.clock.now())
    )
    assert api.get_run(run_id).status is RunStatus.WAITING
    harness.approve(run_id, by="carol")  # finds bob's word, and acts on it
    assert api.get_run(run_id).status is RunStatus.RUNNING
    assert run_step(rt, run_id) is TaskResult.ADVANCED
    assert made == [(f"{run_id}:1", 10), (f"{run_id}:2", 20)]
    word = api.get_steps(run_id)[2].approval
    assert word is not None and word.by == "bob"


def test_a_pause_withdrawn_as_the_run_reached_its_boundary_does_not_hold_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race: a worker loads the run with the pause asked for, the operator
    withdraws it (beside the version), the worker's pause lands anyway. The
    worker sees the withdrawal and resumes the run itself."""
    run_id = api.start_run(agent("withdraw-race", Metered(WORK_TWICE)), "g")
    harness.pause_run(run_id)
    build = transitions.pause

    def withdrawn_between(*args: Any, **kwargs: Any) -> Any:
        checkpoint = build(*args, **kwargs)  # from the run as the worker loaded it
        harness.resume_run(run_id, by="frank")
        return checkpoint

    monkeypatch.setattr(transitions, "pause", withdrawn_between)
    assert run_step(api.runtime(), run_id) is TaskResult.ADVANCED  # resumed, message sent
    monkeypatch.setattr(transitions, "pause", build)
    assert api.get_run(run_id).status is RunStatus.RUNNING
    assert drive(run_id)[-1] is TaskResult.COMPLETED


def test_a_word_on_a_call_that_needs_none_is_refused() -> None:
    run_id = api.start_run(agent("no-word", Metered(WORK_TWICE)), "g")
    run_step(api.runtime(), run_id)  # the model asks for work (no approval needed)
    with pytest.raises(OperatorError, match="does not require approval"):
        harness.reject(run_id, "no", step=1)
    assert drive(run_id)[-1] is TaskResult.COMPLETED


@pytest.mark.parametrize(
    ("options", "message"),
    [({"max_cost_usd": float("nan")}, "positive number"), ({"max_tokens": 0}, "from 1 to")],
)
def test_resume_refuses_budgets_that_are_no_budget(options: dict[str, Any], message: str) -> None:
    run_id = api.start_run(agent("bad-budget", Metered(WORK_TWICE), max_tokens=100), "g")
    with pytest.raises(BadInput, match=message):
        harness.resume_run(run_id, **options)


def test_an_ended_run_cannot_be_resumed_and_keeps_no_pause() -> None:
    run_id = api.start_run(agent("ended", Metered(WORK_TWICE)), "g")
    harness.pause_run(run_id)
    harness.cancel_run(run_id)
    assert api.get_run(run_id).pause_requested is False
    with pytest.raises(DecisionConflict, match="has been cancelled"):
        harness.resume_run(run_id)


def test_what_operators_and_models_wrote_is_shown_as_text() -> None:
    run_id = api.start_run(agent("escape", harness.ScriptedModel(BATCH)), "[bold]goal[/]")
    drive(run_id)
    harness.reject(run_id, "[red]no[/red]", by="[b]eve")
    drive(run_id)
    code, out = cli("show", run_id)
    assert code == 0
    assert "goal: [bold]goal[/]" in out
    assert "(rejected by [b]eve)" in out
    _, out = cli("history", run_id)
    assert "[red]no" in out  # the reason, not a red "no"
