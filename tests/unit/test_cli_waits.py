"""`harness complete` and `harness signal` on the embedded store: each answer
is taken once and says what became of it (answered, kept, received
before), in one line or ``--json``; what the command cannot act on is one
line on stderr and exit 1, as the other operator commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from harness import api
from harness.cli import main
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus, StepStatus

SECRET = "c" * 32


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents,tests.door_wait_agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_TEST_LEDGER", str(tmp_path / "ledger.txt"))
    monkeypatch.setenv("HARNESS_CALLBACK_SECRET", SECRET)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def waiting(agent: str, goal: str = "go") -> str:
    """A run of ``agent`` driven until it waits on its deferred call (step 1)."""
    api.ensure_agents()
    run_id = api.start_run(agent, goal)
    for _ in range(10):
        if run_step(api.runtime(), run_id) is not TaskResult.ADVANCED:
            break
    run = api.get_run(run_id)
    assert run.status is RunStatus.WAITING and run.deferred_from == 1
    return run_id


def drive(run_id: str) -> RunStatus:
    for _ in range(10):
        if run_step(api.runtime(), run_id) is not TaskResult.ADVANCED:
            break
    return api.get_run(run_id).status


def test_complete_answers_the_oldest_deferred_call_once() -> None:
    run_id = waiting("d-shipper")
    done = invoke("complete", run_id, "--result", '{"tracking": "T1"}')
    assert done.exit_code == 0, done.output
    assert done.output == f"{run_id}: step 1 answered (completed by {api.Operator().by})\n"
    again = invoke("complete", run_id, "--step", "1", "--result", '{"tracking": "T2"}', "--json")
    assert again.exit_code == 0, again.output
    said = json.loads(again.output)
    assert (said["delivery"], said["changed"], said["step"]) == ("already", False, 1)
    assert "nothing changed" in said["said"]
    assert drive(run_id) is RunStatus.COMPLETED
    assert api.get_steps(run_id)[1].result == {"tracking": "T1"}


def test_complete_with_an_error_is_a_failed_call_the_model_sees() -> None:
    run_id = waiting("d-shipper")
    done = invoke("complete", run_id, "--error", "the courier lost it", "--by", "ops", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["delivery"] == "answered"
    step = api.get_steps(run_id)[1]
    assert (step.status, step.error) == (StepStatus.FAILED, "the courier lost it")
    details = [e.detail for e in api.reads().all_history(run_id)]
    assert "completed by ops" in details


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "exactly one of --result JSON, --error TEXT"),
        (("--result", "1", "--error", "x"), "exactly one of"),
        (("--result", "{not json"), "not JSON"),
        (("--result", "[" * 100 + "]" * 100), "deeper than"),
        (("--result", "NaN"), "nan is not a JSON number"),
    ],
)
def test_complete_refuses_bad_usage_and_writes_nothing(args: tuple[str, ...], message: str) -> None:
    run_id = waiting("d-shipper")
    before = api.get_run(run_id)
    done = invoke("complete", run_id, *args)
    assert done.exit_code in (1, 2) and message in done.output, done.output
    assert api.get_run(run_id) == before
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody", "--result", "1"), "no run with id 'nobody'"),
        (("{run}", "--step", "0", "--result", "1"), "step 0 is a model step, not a deferred call"),
        (("{run}", "--step", "9", "--result", "1"), "it has no step 9"),
        (("{run}", "--step", "-1", "--result", "1"), "step: must be a step index"),
    ],
)
def test_complete_says_what_it_cannot_act_on(args: tuple[str, ...], message: str) -> None:
    run_id = waiting("d-shipper")
    done = invoke("complete", *(a.format(run=run_id) for a in args))
    assert done.exit_code == 1, done.output
    assert done.output.startswith("error: ") and message in done.output, done.output


def test_a_signal_answers_the_call_deferred_on_it_and_its_retry_changes_nothing() -> None:
    run_id = waiting("d-payer")
    sent = invoke("signal", run_id, "paid", "--data", '{"amount": 5}', "--id", "tx-1")
    assert sent.exit_code == 0, sent.output
    assert sent.output == f"{run_id}: signal 'paid' answered step 1\n"
    again = invoke("signal", run_id, "paid", "--data", '{"amount": 5}', "--id", "tx-1", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["delivery"] == "already"
    assert drive(run_id) is RunStatus.COMPLETED
    assert api.get_steps(run_id)[1].result == {"amount": 5}


def test_a_signal_no_step_asks_for_is_kept() -> None:
    run_id = waiting("d-payer")
    sent = invoke("signal", run_id, "shipped", "--json")
    assert sent.exit_code == 0, sent.output
    said = json.loads(sent.output)
    assert (said["delivery"], said["step"], said["changed"]) == ("kept", None, True)
    assert api.runtime().store.wait_counts()["signals_kept"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("{run}", "paid", "--data", "nan"), "not JSON"),
        (("{run}", "paid", "--data", "[NaN]"), "nan is not a JSON number"),
        (("{run}", "x" * 201), "name: must be a name of 1 to 200 characters"),
        (("{run}", "line\nbreak"), "name: must be printable text"),
        (("{run}", "paid", "--id", "i" * 201), "signal_id: is 201 characters long"),
        (("nobody", "paid"), "no run with id 'nobody'"),
    ],
)
def test_signal_refuses_what_it_cannot_take_and_keeps_nothing(
    args: tuple[str, ...], message: str
) -> None:
    run_id = waiting("d-payer")
    done = invoke("signal", *(a.format(run=run_id) for a in args))
    assert done.exit_code in (1, 2) and message in done.output, done.output
    assert api.runtime().store.wait_counts().get("signals_kept") == 0
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED


def test_a_signal_to_a_run_that_ended_is_a_conflict() -> None:
    run_id = waiting("d-payer")
    assert invoke("cancel", run_id).exit_code == 0
    done = invoke("signal", run_id, "paid")
    assert done.exit_code == 1
    assert "cancelled" in done.output and "no step will take signal 'paid'" in done.output


def test_a_call_that_never_deferred_is_not_answered_already() -> None:
    """A model turn, or a call that ended without deferring, takes no answer:
    saying "answered already" would tell the sender its answer counted."""
    api.ensure_agents()
    run_id = api.start_run("desk", "order 1")
    assert drive(run_id) is RunStatus.COMPLETED
    for step, said in ((0, "step 0 is a model step"), (1, "step 1 ended without deferring")):
        done = invoke("complete", run_id, "--step", str(step), "--result", "1")
        assert done.exit_code == 1 and said in done.output, done.output


def test_send_continues_a_completed_run_and_refuses_a_cancelled_one() -> None:
    api.ensure_agents()
    run_id = api.start_run("chain", "go")
    assert drive(run_id) is RunStatus.COMPLETED
    sent = invoke("send", run_id, "and once more")
    assert sent.exit_code == 0, sent.output
    assert sent.output == f"{run_id}: the run goes on with the message\n"
    assert api.get_run(run_id).status is RunStatus.RUNNING
    steps = api.get_steps(run_id)
    assert steps[-2].kind.value == "user" and steps[-2].args == {"text": "and once more"}
    api.cancel_run(run_id)
    refused = invoke("send", run_id, "hello?")
    assert refused.exit_code == 1
    assert "has been cancelled" in refused.output and refused.output[-1] == "\n"
    empty = invoke("send", run_id, " ")
    assert empty.exit_code == 1 and "text" in empty.output
