"""Replay (harness.replay): a recorded run re-run under another agent, its
tool calls served from the recording, driven in-process on SQLite.

The desk agents (tests.agents) write every real tool call to a ledger file,
so "never called" is counted from outside the runner.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import harness
from harness.engine.cassette import LIVE, SERVED, _served, same_call
from harness.engine.creation import create_run
from harness.errors import (
    AgentNotFound,
    Diverged,
    NotReplayable,
    RunConflict,
    ToolError,
)
from harness.records import Approval, ReplayOrigin, Run, RunStatus, Step, StepKind, StepStatus
from harness.replay.report import BatchReport, ReplayVerdict, compare, report
from harness.replay.rerun import recordings, replay_run
from harness.store import RunQuery
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.ledger import Ledger
from tests.rig import Rig


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger"
    monkeypatch.setenv("HARNESS_TEST_LEDGER", str(path))
    import tests.agents  # noqa: F401  (registers the desk agents)

    return path


@pytest.fixture
def rig(memory_store: MemoryStore, ledger: Path) -> Iterator[Rig]:
    yield Rig(memory_store)


def record(rig: Rig, order: int) -> Run:
    """A desk run on order ``order``, carried to its end."""
    run_id = create_run(rig.runtime(), "desk", f"order {order}", run_id=f"rec-{order}")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED and run.step_count == 6
    return run


def replay(rig: Rig, recording: Run, live_read_only: bool = False) -> tuple[Run, list[Step]]:
    replay_id = replay_run(
        rig.runtime(), recording.run_id, "desk-v2", live_read_only=live_read_only
    )
    rig.drive()
    return rig.load(replay_id), rig.store.steps(replay_id)


def calls_under(ledger: Path, run_id: str) -> list[str]:
    return sorted(k for k in Ledger.read(ledger).by_key if k.startswith(f"{run_id}:"))


def report_of(rig: Rig, replayed: Run) -> dict[str, object]:
    return report(rig.store, replayed.run_id).to_dict()


def test_a_replay_that_follows_its_recording_is_served_and_calls_nothing(
    rig: Rig, ledger: Path
) -> None:
    recording = record(rig, 3)
    assert calls_under(ledger, recording.run_id) == [f"rec-3:{i}" for i in (1, 3, 4)]

    replayed, steps = replay(rig, recording)

    assert replayed.status is RunStatus.COMPLETED and replayed.result == "order 3 refunded"
    assert replayed.replay_of == ReplayOrigin("rec-3", live_read_only=False)
    assert calls_under(ledger, replayed.run_id) == []
    recorded = rig.store.steps("rec-3")
    # The results are the recording's own: they still name its keys.
    assert [s.result for s in steps if s.kind is StepKind.TOOL] == [
        s.result for s in recorded if s.kind is StepKind.TOOL
    ]
    report = report_of(rig, replayed)
    assert report["outcome"] == ReplayVerdict.MATCHED and report["divergence"] is None
    assert (report["steps_compared"], report["served"], report["live"]) == (6, 3, 0)
    assert report["same_answer"] is True
    # Version 2 says 10 more input tokens on each of its 3 turns.
    assert report["delta"] == {"input_tokens": 30, "output_tokens": 0, "cost_usd": 0.0}


def test_other_words_for_the_same_calls_is_a_match_with_another_answer(rig: Rig) -> None:
    replayed, _ = replay(rig, record(rig, 4))
    report = report_of(rig, replayed)
    assert report["outcome"] == ReplayVerdict.MATCHED and report["same_answer"] is False
    assert report["recording"]["answer"] == "order 4 refunded"  # type: ignore[index]
    assert report["replay"]["answer"] == "Order 4: refunded."  # type: ignore[index]


@pytest.mark.parametrize("live_read_only", [False, True])
def test_a_side_effecting_call_off_the_recording_stops_the_replay_uncalled(
    rig: Rig, ledger: Path, live_read_only: bool
) -> None:
    replayed, steps = replay(rig, record(rig, 1), live_read_only)

    assert replayed.status is RunStatus.DIVERGED
    assert steps[3].status is StepStatus.FAILED and steps[3].tool == "effect"
    assert "left the recording of rec-1" in (steps[3].error or "")
    assert steps[4].status is StepStatus.PENDING  # the mail: never reached
    assert calls_under(ledger, replayed.run_id) == []  # not even the read_only lookup: served
    d = report_of(rig, replayed)["divergence"]
    assert d == {
        "step": 3,
        "kind": "tool",
        "recorded": 'effect({"n": 1})',
        "replayed": 'effect({"n": 1001})',
        "recorded_tool": "effect",
        "replayed_tool": "effect",
        "args_diff": [{"arg": "n", "recorded": 1, "replayed": 1001}],
        "text_step": 2,
        "text_diff": [
            "--- recording",
            "+++ replay",
            "@@ -1 +1 @@",
            "-Order 1 was delivered. Refunding 1.",
            "+Order 1 was delivered. Refunding 1001.",
        ],
    }


def test_a_read_only_call_off_the_recording_stops_it_unless_live_reads_are_allowed(
    rig: Rig, ledger: Path
) -> None:
    recording = record(rig, 2)
    stopped, _ = replay(rig, recording)
    assert stopped.status is RunStatus.DIVERGED
    assert calls_under(ledger, stopped.run_id) == []

    live, steps = replay(rig, recording, live_read_only=True)
    assert live.status is RunStatus.COMPLETED
    # Only the lookup of another order was made; the refund and the mail were served.
    assert calls_under(ledger, live.run_id) == [f"{live.run_id}:1"]
    assert steps[1].result == {"order": 3, "status": "delivered", "key": f"{live.run_id}:1"}
    report = report_of(rig, live)
    assert report["outcome"] == ReplayVerdict.DIVERGED and report["live_read_only"] is True
    assert (report["served"], report["live"]) == (2, 1)
    assert report["divergence"]["step"] == 1  # type: ignore[index]


def test_a_replay_waits_for_no_approval_and_serves_the_operators_word(rig: Rig) -> None:
    from harness.engine import operations

    run_id = create_run(rig.runtime(), "approver", "charge", run_id="rec-approved")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.WAITING
    rt = rig.runtime()
    operations.decide(rt, run_id, approve=True, who="ops", step_index=1, args={"amount": 11})
    rig.drive()
    operations.decide(rt, run_id, approve=False, who="ops", step_index=2, reason="too much")
    rig.drive()
    operations.decide(rt, run_id, approve=True, who="ops", step_index=3)
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED

    replay_id = replay_run(rt, run_id, "approver")
    rig.drive()
    replayed, steps = rig.load(replay_id), rig.store.steps(replay_id)
    assert replayed.status is RunStatus.COMPLETED
    recorded = rig.store.steps(run_id)
    # Asked with the model's own arguments, answered with what the operator let happen.
    assert steps[1].args == {"amount": 10} and steps[1].result == recorded[1].result
    assert steps[2].status is StepStatus.FAILED and steps[2].error == recorded[2].error
    assert "too much" in (steps[2].error or "")
    assert report_of(rig, replayed)["outcome"] == ReplayVerdict.MATCHED


def test_only_an_ended_run_with_an_agent_that_exists_can_be_replayed(rig: Rig) -> None:
    recording = record(rig, 3)
    moving = create_run(rig.runtime(), "desk", "order 7", run_id="moving")
    with pytest.raises(
        NotReplayable, match="moving is pending: a replay needs a run that has ended"
    ):
        replay_run(rig.runtime(), moving, "desk-v2")
    with pytest.raises(AgentNotFound):
        replay_run(rig.runtime(), recording.run_id, "no-such-agent")


def test_an_explicit_replay_id_makes_it_idempotent(rig: Rig) -> None:
    recording = record(rig, 3)
    rt = rig.runtime()
    first = replay_run(rt, recording.run_id, "desk-v2", new_run_id="r1")
    sent = list(rig.sent)
    assert replay_run(rt, recording.run_id, "desk-v2", new_run_id="r1") == first == "r1"
    assert rig.sent == sent  # not dispatched again
    with pytest.raises(RunConflict, match="exists with agent desk-v2 and goal 'order 3', a replay"):
        replay_run(rt, recording.run_id, "desk", new_run_id="r1")


def test_a_batch_chooses_ended_recordings_never_replays(rig: Rig) -> None:
    recordings_made = [record(rig, n) for n in range(4)]
    replayed, _ = replay(rig, recordings_made[3])
    chosen = recordings(rig.store, agent=None, status=RunStatus.COMPLETED, since=None, limit=10)
    assert {r.run_id for r in chosen} == {r.run_id for r in recordings_made}
    assert replayed.run_id not in {r.run_id for r in chosen}
    assert len(recordings(rig.store, agent="desk", status=None, since=None, limit=2)) == 2
    assert recordings(rig.store, agent="desk-v2", status=None, since=None, limit=10) == []
    assert [r.run_id for r in rig.store.query_runs(RunQuery(limit=10, replay_of="rec-3"))] == [
        replayed.run_id
    ]


def test_a_batch_report_counts_outcomes_and_where_they_diverged(rig: Rig) -> None:
    reports = []
    for n in range(8):
        replayed, _ = replay(rig, record(rig, n))
        reports.append(report(rig.store, replayed.run_id))
    batch = BatchReport("desk-v2", reports).to_dict()
    assert (batch["runs"], batch["matched"], batch["diverged"], batch["unfinished"]) == (8, 4, 4, 0)
    assert batch["diverged_at"] == [
        {"step": 1, "at": "find", "count": 2},
        {"step": 3, "at": "effect", "count": 2},
    ]
    # Matched runs: 3 turns of +10 input tokens. A replay that stopped at the
    # lookup made 1 turn of 3, one that stopped at the refund 2: 110 - 300, 220 - 300.
    mean = (4 * 30 + 2 * (110 - 300) + 2 * (220 - 300)) / 8
    assert batch["mean_delta"]["input_tokens"] == mean  # type: ignore[index]


# -- the comparison and the cassette on their own ------------------------------------


def _run(status: RunStatus, **kw: object) -> Run:
    return Run("r", "a", "g", status, cursor=0, version=1, step_count=1, **kw)  # type: ignore[arg-type]


def _model(index: int, result: dict[str, object]) -> Step:
    return Step("r", index, StepKind.MODEL, StepStatus.DONE, result=result)


def _tool(
    index: int, tool: str, args: dict[str, object], status: StepStatus = StepStatus.DONE
) -> Step:
    return Step("r", index, StepKind.TOOL, status, tool=tool, args=args, result="ok")


def test_a_model_that_answers_where_the_recording_called_a_tool_diverges_there() -> None:
    recorded = [
        _model(0, {"tool_calls": [{"name": "find", "args": {}}], "text": "Looking."}),
        _tool(1, "find", {}),
        _model(2, {"final": "done"}),
    ]
    replayed = [_model(0, {"final": "I can tell you now."})]
    replay = _run(RunStatus.COMPLETED, result="I can tell you now.", replay_of=ReplayOrigin("r0"))
    report = compare(_run(RunStatus.COMPLETED, result="done"), recorded, replay, replayed, {})
    assert report.outcome == ReplayVerdict.DIVERGED and report.divergence is not None
    assert (report.divergence.step, report.divergence.kind) == (0, "model")
    assert report.divergence.recorded == "a turn calling find"
    assert report.divergence.replayed == "a final answer: 'I can tell you now.'"
    assert "+I can tell you now." in report.divergence.text_diff


def test_the_same_calls_with_another_ending_diverge_at_the_end() -> None:
    recorded = [_model(0, {"final": "done"})]
    replay = _run(RunStatus.FAILED, error="model step 0 failed", replay_of=ReplayOrigin("r0"))
    failed = [Step("r", 0, StepKind.MODEL, StepStatus.FAILED, error="model step 0 failed")]
    report = compare(_run(RunStatus.COMPLETED, result="done"), recorded, replay, failed, {})
    assert report.divergence is not None and report.divergence.kind == "end"
    assert report.divergence.replayed == "failed after 1 steps: model step 0 failed"
    lines = "\n".join(report.lines())
    assert (
        "recording (completed): 'done'" in lines
        and "replay    (failed): (none: model step 0 failed)" in lines
    )


def test_a_replay_still_moving_is_unfinished() -> None:
    replay = _run(RunStatus.RUNNING, replay_of=ReplayOrigin("r0"))
    recorded = [_model(0, {"tool_calls": [{"name": "find", "args": {}}]}), _tool(1, "find", {})]
    report = compare(_run(RunStatus.COMPLETED), recorded, replay, recorded[:1], {})
    assert report.outcome == ReplayVerdict.UNFINISHED and report.steps_compared == 1


def test_the_cassette_matches_name_and_arguments_as_the_model_asked() -> None:
    approved = Step(
        "r",
        1,
        StepKind.TOOL,
        StepStatus.DONE,
        tool="charge",
        args={"amount": 11},
        approval=Approval.from_json({"decision": "approved", "proposed_args": {"amount": 10}}),
    )
    assert same_call(approved, "charge", {"amount": 10})
    assert not same_call(approved, "charge", {"amount": 11})
    assert not same_call(approved, "refund", {"amount": 10})
    assert not same_call(None, "charge", {"amount": 10})
    assert same_call(_tool(1, "find", {"a": 1, "b": [1, 2]}), "find", {"b": [1, 2], "a": 1})


def test_the_cassette_serves_a_recorded_failure_and_refuses_an_unsettled_call() -> None:
    failed = _tool(1, "find", {}, StepStatus.FAILED)
    failed = Step(**{**failed.__dict__, "error": "tool 'find' raised KeyError: 'x'"})
    with pytest.raises(ToolError, match="raised KeyError"):
        _served(failed, failed)
    doubt = _tool(1, "send", {}, StepStatus.IN_DOUBT)
    with pytest.raises(Diverged, match="never settled"):
        _served(doubt, doubt)


def test_a_replay_whose_recording_is_deleted_midway_stops_and_says_so(
    rig: Rig, ledger: Path
) -> None:
    recording = record(rig, 3)
    replay_id = replay_run(rig.runtime(), recording.run_id, "desk-v2")
    rig.drive(limit=1)  # the first model turn only
    rig.store.delete_runs([recording.run_id], rig.clock.now() + 1, (RunStatus.COMPLETED,))
    rig.drive()
    replayed = rig.load(replay_id)
    assert replayed.status is RunStatus.DIVERGED
    assert "the recording rec-3 no longer exists (pruned?)" in (replayed.error or "")
    assert calls_under(ledger, replay_id) == []


# -- found in review: every way a replay can end, and what it is told -------------


def _desk_variant(name: str, version: int, *tools: object, **options: object) -> None:
    from tests import agents

    chosen = tools or (agents.find, agents.effect, agents.send_email)
    harness.register_agent(
        harness.Agent(name=name, model=agents.DeskModel(version), tools=list(chosen), **options)  # type: ignore[arg-type]
    )


@pytest.fixture
def variants(ledger: Path) -> None:
    from tests import agents

    _desk_variant("u-desk-no-mail", 1, agents.find, agents.effect)
    _desk_variant("u-desk-short", 1, max_steps=4)

    @harness.tool(name="find", effect="read_only", requires_approval=True)
    def guarded_find(order: int) -> dict[str, int]:
        raise AssertionError("a replay called a tool that needs approval")

    _desk_variant("u-desk-guarded-v2", 2, guarded_find, agents.effect, agents.send_email)


def test_the_same_call_not_answered_from_the_recording_is_an_outcome_divergence(
    rig: Rig, ledger: Path, variants: None
) -> None:
    recording = record(rig, 3)
    replay_id = replay_run(rig.runtime(), recording.run_id, "u-desk-no-mail")
    rig.drive()
    got = report(rig.store, replay_id).to_dict()
    assert got["outcome"] == ReplayVerdict.DIVERGED
    assert (got["served"], got["live"]) == (2, 0)
    d = got["divergence"]
    assert (d["step"], d["kind"]) == (4, "outcome")  # type: ignore[index]
    assert d["recorded"] == 'send_email({"to": "customer3@example.com"}): done'  # type: ignore[index]
    assert "unknown tool 'send_email'" in d["replayed"]  # type: ignore[index]
    assert calls_under(ledger, replay_id) == []


def test_an_identical_replay_of_a_failed_run_matches(rig: Rig, variants: None) -> None:
    run_id = create_run(rig.runtime(), "u-desk-short", "order 3", run_id="short")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.FAILED  # out of steps, with steps pending
    replay_id = replay_run(rig.runtime(), run_id, "u-desk-short")
    rig.drive()
    got = report(rig.store, replay_id)
    assert got.outcome == ReplayVerdict.MATCHED and got.recording.steps == got.replay.steps == 4


def test_a_replay_calls_no_tool_that_needs_approval_even_a_read_only_one(
    rig: Rig, ledger: Path, variants: None
) -> None:
    replay_id = replay_run(
        rig.runtime(), record(rig, 2).run_id, "u-desk-guarded-v2", live_read_only=True
    )
    rig.drive()
    replayed = rig.load(replay_id)
    assert replayed.status is RunStatus.DIVERGED
    assert "not called: it needs approval" in (replayed.error or "")


def test_a_cancelled_or_paused_replay_is_reported_as_such(rig: Rig) -> None:
    from harness.engine import operations

    recording = record(rig, 3)
    rt = rig.runtime()
    cancelled = replay_run(rt, recording.run_id, "desk-v2")
    operations.cancel(rt, cancelled, "enough")
    paused = replay_run(rt, recording.run_id, "desk-v2")
    operations.pause(rt, paused, "ops")
    rig.drive()
    assert report(rig.store, cancelled).outcome == ReplayVerdict.CANCELLED
    assert report(rig.store, paused).outcome == ReplayVerdict.HELD


def test_a_replay_of_a_replay_is_refused_and_a_fork_of_one_stays_a_replay(
    rig: Rig, ledger: Path
) -> None:
    from harness.runs.fork import fork_run

    replayed, _ = replay(rig, record(rig, 1))
    with pytest.raises(NotReplayable, match="is a replay of rec-1: replay that run instead"):
        replay_run(rig.runtime(), replayed.run_id, "desk")
    forked = fork_run(rig.runtime(), replayed.run_id, 2, agent="desk", new_run_id="fork-of-replay")
    rig.drive()
    fork = rig.load(forked)
    assert fork.replay_of == ReplayOrigin("rec-1") and fork.status is RunStatus.COMPLETED
    assert calls_under(ledger, forked) == []  # the refund and the mail: served


def test_the_history_says_how_each_call_was_answered(rig: Rig) -> None:
    recording = record(rig, 2)
    live_id = replay_run(rig.runtime(), recording.run_id, "desk-v2", live_read_only=True)
    rig.drive()
    details = {
        e.step_index: e.detail for e in rig.store.events(live_id) if e.step_index in (1, 3, 4)
    }
    assert details == {1: LIVE, 3: SERVED, 4: SERVED}


def test_the_cli_validates_its_options_and_waits_no_longer_than_asked(
    sqlite_store: SQLStore,
    ledger: Path,
    monkeypatch: pytest.MonkeyPatch,
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from harness import api
    from harness.cli import main

    rig = Rig(sqlite_store)  # the CLI opens the store by its URL: a file, not memory
    record(rig, 3)
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    api.reset_runtime()

    def run(*args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(main, ["replay", *args])
        return result.exit_code, result.stdout, result.stderr

    code, out, err = run("rec-3", "--agent", "desk-v2", "--timeout", "0")  # no worker here
    assert code == 2 and "): unfinished" in out.splitlines()[0]
    assert "not ended within 0s: is a worker running on the same store and broker? (" in err
    assert run("--agent", "desk-v2")[0] == 2  # neither RUN_ID nor --batch
    code, _, err = run("rec-3", "--agent", "desk-v2", "--limit", "3")
    assert code == 2 and "--limit: only with --batch" in err
    code, _, err = run("--batch", "--agent", "no-such-agent")
    assert code == 1 and err.startswith("error: no agent named 'no-such-agent'")
    code, _, err = run("--batch", "--agent", "desk-v2", "--since", "last week")
    assert code == 2 and "'last week' is not a date" in err
    code, _, err = run("nope", "--agent", "desk-v2")
    assert code == 1 and err.startswith("error: no run with id 'nope' (this command used store ")
    api.reset_runtime()
