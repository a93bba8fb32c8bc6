"""The operator's door on the embedded store: what an operator sends (a goal,
a reason, a name, edited arguments, a result) is checked once, in
harness.api, for Python, the CLI and HTTP alike; and each action says
whether it changed the run (the CLI: "already ...", exit 0) or did not take
effect (exit 1 with the reason).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import harness
from harness import api
from harness.cli import main
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.errors import BadInput, DecisionConflict, RunConflict
from harness.records import RunStatus, StepStatus
from harness.store import Checkpoint, RunPatch, StepPatch


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_TEST_LEDGER", str(tmp_path / "ledger.txt"))


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def in_doubt_run() -> str:
    """A mailer run whose send_email call was interrupted: waiting for an operator."""
    rt = api.runtime()
    run_id = api.start_run("mailer", "mail a")
    run_step(rt, run_id)  # the model asks for send_email
    run = rt.store.load(run_id)
    now = rt.clock.now()
    rt.store.checkpoint(  # a worker began the call, then died
        Checkpoint(
            run_id,
            run.version,
            "dead-worker",
            now - 100,
            run=RunPatch(owner="dead-worker", lease_expires_at=now - 1),
            steps=(StepPatch(1, status=StepStatus.RUNNING, started_at=now - 100),),
        )
    )
    run_step(rt, run_id)
    assert api.get_run(run_id).status is RunStatus.WAITING
    return run_id


def awaiting_run() -> str:
    """An approver run waiting on the approval of its first charge (step 1)."""
    api.ensure_agents()
    run_id = api.start_run("approver", "charge three")
    assert run_step(api.runtime(), run_id) is TaskResult.ADVANCED  # the model asks for charges
    assert run_step(api.runtime(), run_id) is TaskResult.WAITING
    return run_id


# Every value an operator sends is checked at the door -----------------------------


def test_a_result_nested_600_deep_is_refused_and_the_step_stays_in_doubt() -> None:
    run_id = in_doubt_run()
    with pytest.raises(BadInput) as refused:
        harness.resolve_run(run_id, "succeeded", nested(600))
    assert refused.value.field == "result"
    assert "nested deeper than 64 levels" in str(refused.value)
    assert api.get_steps(run_id)[1].status is StepStatus.IN_DOUBT
    run = api.get_run(run_id)
    assert run.status is RunStatus.WAITING
    result = invoke("resolve", run_id, "--succeeded", json.dumps(nested(600)))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: --succeeded: at ")  # the CLI names its option
    assert result.stderr.endswith(": nested deeper than 64 levels\n")
    assert "Traceback" not in result.output and len(result.stderr.splitlines()) == 1
    assert api.get_run(run_id).version == run.version  # nothing written


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("[" * 100_000 + "]" * 100_000, 2),
        ("NaN", 1),
        ('{"sent": Infinity}', 1),
        ("1" + "0" * 2000, 1),
    ],
)
def test_a_result_json_cannot_say_is_a_one_line_error(text: str, code: int) -> None:
    """Too deep for the parser is a usage error (2), what no column holds a refusal (1)."""
    run_id = in_doubt_run()
    result = invoke("resolve", run_id, "--succeeded", text)
    assert result.exit_code == code, result.output
    assert "--succeeded" in result.stderr and "Traceback" not in result.output
    assert api.get_steps(run_id)[1].status is StepStatus.IN_DOUBT


def test_edited_arguments_with_nan_are_refused_naming_the_field() -> None:
    run_id = awaiting_run()
    with pytest.raises(BadInput) as refused:
        harness.approve(run_id, args={"amount": float("nan")})
    assert refused.value.field == "args"
    with pytest.raises(BadInput, match="args"):
        harness.approve(run_id, args={(1, 2): 2})  # type: ignore[dict-item]
    result = invoke("approve", run_id, "--args", '{"amount": NaN}')
    assert (result.exit_code, result.stderr) == (
        1,
        "error: --args: at amount: nan is not a JSON number\n",
    )
    assert api.get_steps(run_id)[1].approval is None


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: harness.start_run("chain", "a goal with a \x00 in it"), "goal"),
        (lambda: harness.start_run("chain", "a lone \ud800"), "goal"),
        (lambda: harness.start_run("chain", "x" * ((1 << 20) + 1)), "goal"),
        (lambda: harness.start_run("chain", "g", run_id="r" * 129), "run_id"),
        (lambda: harness.start_run("chain", "g", run_id="r\x00"), "run_id"),
        (lambda: harness.start_run("ch\x00ain", "g"), "agent"),
        (lambda: harness.cancel_run("r1", "because\x00"), "reason"),
        (lambda: harness.reject("r1", "no\ud800"), "reason"),
        (lambda: harness.pause_run("r1", by="x" * 201), "by"),
        (lambda: harness.approve("r1", by="al\x00ice"), "by"),
        (lambda: harness.resume_run("r1", max_tokens=0), "max_tokens"),
        (lambda: harness.resume_run("r1", max_tokens=2**31), "max_tokens"),
        (lambda: harness.resume_run("r1", max_cost_usd=float("nan")), "max_cost_usd"),
        (lambda: harness.resolve_run("r1", "maybe"), "decision"),
        (lambda: harness.cancel_run("r\x00"), "run_id"),
        (lambda: harness.fork_run("r1", 0, goal="a \x00 goal"), "goal"),
        (lambda: harness.fork_run("r1", 0, new_run_id="f" * 129), "run_id"),
        (lambda: harness.replay_run("r1", "chain", new_run_id="r\ud800"), "run_id"),
    ],
)
def test_text_and_numbers_no_column_can_hold_are_refused(call: Any, field: str) -> None:
    with pytest.raises(BadInput) as refused:
        call()
    assert refused.value.field == field
    assert api.reads().list_runs().runs == []


def test_the_command_line_refuses_unstorable_text_in_one_line() -> None:
    result = invoke("start", "chain", "a lone \udcff byte")
    assert (result.exit_code, result.stderr) == (
        1,
        "error: GOAL: is not UTF-8 text (the byte 0xff at 7)\n",
    )
    assert api.reads().list_runs().runs == []


# One run id, one agent and goal ---------------------------------------------------


def test_start_of_an_existing_id_says_it_existed_and_another_goal_is_an_error() -> None:
    first = invoke("start", "chain", "the goal", "--run-id", "r1")
    assert (first.exit_code, first.stdout, first.stderr) == (0, "r1\n", "")
    again = invoke("start", "chain", "the goal", "--run-id", "r1")
    assert (again.exit_code, again.stdout) == (0, "r1\n")
    assert again.stderr == "run r1 existed with this agent and goal: nothing started\n"
    shown = invoke("start", "chain", "the goal", "--run-id", "r1", "--json")
    assert json.loads(shown.stdout) == {"run_id": "r1"}
    assert shown.stderr == again.stderr
    other = invoke("start", "chain", "another goal", "--run-id", "r1")
    assert other.exit_code == 1 and other.stdout == ""
    assert other.stderr == (
        "error: run r1 exists with agent chain and goal 'the goal': another run, not created\n"
    )
    with pytest.raises(RunConflict) as conflict:
        harness.start_run("long-chain", "the goal", run_id="r1")
    assert conflict.value.run.goal == "the goal"
    assert api.get_run("r1").version == 1


# Decisions that did not take effect, and repeats -------------------------------------


def test_approve_then_reject_is_refused_with_what_the_call_has() -> None:
    run_id = awaiting_run()
    approved = invoke("approve", run_id, "--by", "alice")
    assert approved.exit_code == 0 and "step 1 approved by alice" in approved.stdout
    rejected = invoke("reject", run_id, "--step", "1", "--reason", "no", "--by", "bob")
    assert rejected.exit_code == 1
    assert rejected.stderr == (
        f"error: run {run_id} is running: step 1 was already approved by alice; nothing changed\n"
    )
    again = invoke("approve", run_id, "--step", "1", "--by", "carol")
    assert again.exit_code == 0
    assert again.stdout == f"{run_id} running: step 1 was already approved by alice\n"
    with pytest.raises(DecisionConflict):
        harness.reject(run_id, "no", step=1)
    assert run_step(api.runtime(), run_id) is TaskResult.ADVANCED
    assert api.get_steps(run_id)[1].result == {"charged": 10, "key": f"{run_id}:1"}


def test_repeats_of_cancel_and_pause_say_already() -> None:
    run_id = api.start_run("chain", "g")
    assert invoke("pause", run_id).stdout == f"{run_id} pending: pauses at its next step boundary\n"
    again = invoke("pause", run_id)
    assert (again.exit_code, again.stdout) == (
        0,
        f"{run_id} pending: a pause was already asked for\n",
    )
    assert invoke("cancel", run_id).stdout == f"{run_id} cancelled\n"
    again = invoke("cancel", run_id)
    assert (again.exit_code, again.stdout) == (
        0,
        f"{run_id} cancelled: already cancelled: cancelled by operator\n",
    )
    late = invoke("pause", run_id)
    assert (late.exit_code, late.stderr) == (
        1,
        f"error: run {run_id} has been cancelled; nothing changed\n",
    )


def test_a_cancel_of_a_completed_run_is_refused() -> None:
    api.ensure_agents()
    run_id = api.start_run("chain", "g")
    for _ in range(10):
        if run_step(api.runtime(), run_id) is not TaskResult.ADVANCED:
            break
    assert api.get_run(run_id).status is RunStatus.COMPLETED
    result = invoke("cancel", run_id)
    assert (result.exit_code, result.stderr) == (
        1,
        f"error: run {run_id} has completed; nothing changed\n",
    )
