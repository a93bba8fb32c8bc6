"""`harness resolve` and `harness stats` on the embedded store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import api
from harness.cli import main
from harness.engine.runner import run_step
from harness.records import RunStatus, StepStatus
from harness.store import Checkpoint, RunPatch, StepPatch


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))


def _in_doubt_run() -> str:
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
            steps=(
                StepPatch(1, status=StepStatus.RUNNING, started_at=now - 100, bump_attempts=True),
            ),
        )
    )
    run_step(rt, run_id)
    assert api.get_run(run_id).status is RunStatus.WAITING
    return run_id


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_resolve_succeeded_records_the_operator_result() -> None:
    run_id = _in_doubt_run()
    code, out = _invoke("resolve", run_id, "--succeeded", '{"sent": true}', "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert (shown["status"], shown["cursor"]) == ("running", 2)
    step = api.get_steps(run_id)[1]
    assert (step.status, step.result) == (StepStatus.DONE, {"sent": True})
    code, out = _invoke("history", run_id, "--json")
    details = [e["detail"] for e in json.loads(out)]
    assert "operator: succeeded" in details


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "exactly one of"),
        (("--retry", "--succeeded", "1"), "exactly one of"),
        (("--retry", "--fail"), "exactly one of"),
        (("--succeeded", "{not json"), "not JSON"),
    ],
)
def test_resolve_rejects_bad_usage(args: tuple[str, ...], message: str) -> None:
    run_id = _in_doubt_run()
    code, out = _invoke("resolve", run_id, *args)
    assert code == 2 and message in out


def test_resolve_on_a_run_with_nothing_in_doubt_is_a_one_line_error() -> None:
    run_id = api.start_run("mailer", "mail a")
    result = CliRunner().invoke(main, ["resolve", run_id, "--retry"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: run {run_id} is pending, with no step in doubt to resolve"
    )


def test_stats_counts_recovery_and_stuck_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_RUNNING_ALERT", "50")
    api.reset_runtime()
    _in_doubt_run()
    stuck = api.start_run("mailer", "mail b")
    rt = api.runtime()
    run_step(rt, stuck)
    run = rt.store.load(stuck)
    rt.store.checkpoint(
        Checkpoint(
            stuck,
            run.version,
            "w",
            rt.clock.now(),
            steps=(StepPatch(1, status=StepStatus.RUNNING, started_at=rt.clock.now() - 60),),
        )
    )
    code, out = _invoke("stats", "--json")
    assert code == 0, out
    stats = json.loads(out)
    assert stats["recovered_running_steps"] == 1
    assert stats["lease_takeovers"] == 1
    assert stats["in_doubt_steps"] == 1
    assert stats["running_steps_older_than_alert"] == 1
    assert stats["running_alert_seconds"] == 50
    assert stats["runs_by_status"] == {"waiting": 1, "running": 1}
    api.cancel_run(stuck)  # a finished run's last step stays RUNNING: not an alert
    assert api.stats()["running_steps_older_than_alert"] == 0
