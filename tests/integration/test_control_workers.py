"""Operator control with real workers: an approval survives a SIGKILL between
it and its call (the tool runs once, counted by the ledger outside the
worker), a budget pauses a run before the call that would exceed it and a
resume with a raised budget finishes it, and a pause lets the step in flight
finish. Operators act from the CLI (in this process, on the same store)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner

import harness
from harness import api
from harness.cli import main
from harness.records import RunStatus, StepStatus
from tests.cluster import Cluster
from tests.wire import WireServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_an_approval_survives_a_sigkill_before_its_call(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster("filesystem")
    c.beat()
    doomed = c.worker(env={"HARNESS_CRASH_AT": "after_running_checkpoint.tool"})
    run_id = api.start_run("approver", "charge three")
    c.wait_until("the first call to await approval", lambda: api.get_run(run_id).status.held)
    first = api.get_steps(run_id)[1]
    assert (first.status, first.args) == (StepStatus.AWAITING_APPROVAL, {"amount": 10})

    out = cli("approve", run_id, "--by", "alice")
    assert "step 1 approved by alice" in out
    # The worker claims the approved call and dies before making it.
    c.wait_until("the armed worker to kill itself", lambda: doomed.proc.poll() is not None)
    c.kill(doomed)
    # The rest of the batch, decided ahead from Python while no worker runs.
    harness.approve(run_id, step=2, by="alice")
    harness.approve(run_id, step=3, args={"amount": 35}, by="bob")
    cli("approve", run_id, "--step", "2", "--by", "mallory")  # twice: a no-op
    c.worker()

    ledger = c.assert_completed_once([run_id])
    for index in (1, 2, 3):
        key = f"{run_id}:{index}"
        assert (ledger.calls(key), ledger.effects(key)) == (1, 1), key
    steps = api.get_steps(run_id)
    assert [s.result["charged"] for s in steps[1:4]] == [10, 20, 35]
    assert steps[1].attempts == 2  # the claim the kill interrupted, and the call
    assert [s.approval and s.approval.by for s in steps[1:4]] == ["alice", "alice", "bob"]
    words = [(e.to_status, e.worker) for e in api.reads().store.events(run_id)]
    assert ("approved", "mallory") not in words


@pytest.mark.postgres
@pytest.mark.redis
def test_a_budget_pauses_before_the_call_and_resume_finishes_it(
    make_cluster: Callable[..., Cluster], wire: WireServer
) -> None:
    c = make_cluster("redis")
    c.beat()
    c.worker()
    wire.script(
        "on a budget",
        [
            {
                "tool_calls": [{"name": "effect", "args": {"n": 1}}],
                "usage": {"input_tokens": 700, "output_tokens": 100},
            },
            {"text": "done within the new budget"},
        ],
    )
    run_id = api.start_run("budgeted-bot", "on a budget")
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.PAUSED
    assert run.error is not None and run.error.startswith("token budget: 800 used + ")
    assert wire.calls("on a budget", 1) == 0  # stopped before the call, not after

    out = cli("resume", run_id, "--max-tokens", "5000", "--by", "ops")
    assert "running" in out
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.COMPLETED, run.error
    assert (run.max_tokens, wire.billed("on a budget", 1)) == (5000, 1)
    assert c.ledger().effects(f"{run_id}:1") == 1


def test_a_pause_lets_the_step_in_flight_finish(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster("filesystem")
    c.beat()
    c.worker()
    (run_id,) = c.start("slow-chain")  # three 2 s calls
    c.wait_until("the first call to start", lambda: c.ledger().calls(f"{run_id}:1") == 1)
    out = cli("pause", run_id, "--by", "ops")
    assert "pauses at its next step boundary" in out
    (run,) = c.wait_all([run_id])
    assert run.status is RunStatus.PAUSED
    steps = api.get_steps(run_id)
    assert steps[1].status is StepStatus.DONE  # finished and recorded, not fenced
    assert c.ledger().calls(f"{run_id}:3") == 0
    cli("resume", run_id)
    c.assert_completed_once([run_id])
