"""Which runs the dashboard calls out, and why (harness.reads.attention, needs);
the read model of sweeps (stats) and of abandoned steps."""

from __future__ import annotations

import dataclasses

import pytest

from harness.engine import recovery, transitions
from harness.reads import Attention, Reads, attention, needs
from harness.records import Run, RunStatus, Step, StepKind, StepStatus
from harness.store import SweepKind
from harness.store.memory import MemoryStore
from tests.rig import Rig, insert_run

NOW = 10_000.0
ALERT = 60.0


def run_at(status: RunStatus, step: StepStatus | None, *, started: float | None = None) -> Run:
    current = (
        None if step is None else Step("r", 1, StepKind.TOOL, step, tool="t", started_at=started)
    )
    return Run("r", "a", "g", status, cursor=1, version=3, step_count=2, current=current)


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (run_at(RunStatus.PENDING, StepStatus.PENDING), None),
        (run_at(RunStatus.RUNNING, StepStatus.RUNNING, started=NOW - 10), None),
        (run_at(RunStatus.RUNNING, StepStatus.RUNNING, started=NOW - 61), "stuck"),
        (run_at(RunStatus.WAITING, StepStatus.IN_DOUBT), "in_doubt"),
        (run_at(RunStatus.WAITING, StepStatus.AWAITING_APPROVAL), "awaiting_approval"),
        (run_at(RunStatus.PAUSED, StepStatus.PENDING), "paused"),
        (run_at(RunStatus.COMPLETED, StepStatus.RUNNING, started=0.0), None),
        (run_at(RunStatus.PENDING, None), None),
    ],
)
def test_attention(run: Run, expected: str | None) -> None:
    assert attention(run, NOW, ALERT) == expected


def test_a_blocked_run_is_called_out_once_nothing_more_pressing_is() -> None:
    blocked = dataclasses.replace(run_at(RunStatus.PENDING, StepStatus.PENDING), blocked="no agent")
    assert attention(blocked, NOW, ALERT) == "blocked"
    doubtful = dataclasses.replace(run_at(RunStatus.WAITING, StepStatus.IN_DOUBT), blocked="x")
    assert attention(doubtful, NOW, ALERT) == "in_doubt"


# -- a run that fell to the sweeper, and no sweep came -------------------------

UNSWEPT = (
    "lease expired 62s ago and no sweep has run since: is `celery beat` running? "
    "(`harness sweep` recovers it now)"
)


def test_a_lapsed_lease_with_no_sweep_since_says_so_and_what_to_do() -> None:
    run = dataclasses.replace(
        run_at(RunStatus.RUNNING, StepStatus.RUNNING, started=NOW - 70),
        owner="w1/1",
        lease_expires_at=NOW - 62,
    )
    assert needs(run, NOW, ALERT, unswept=True) == Attention("unswept", UNSWEPT)
    assert needs(run, NOW, ALERT) == Attention("stuck", "step 1 running for 70s, longer than 60s")


def test_a_run_the_sweeper_must_wake_says_its_wake_up_passed() -> None:
    run = dataclasses.replace(
        run_at(RunStatus.PENDING, StepStatus.PENDING),
        owner=transitions.RESCHEDULED,
        wake_at=NOW - 9,
    )
    found = needs(run, NOW, ALERT, unswept=True)
    assert found is not None and found.detail.startswith("wake-up was 9s ago and no sweep")


@pytest.fixture
def rig(memory_store: MemoryStore) -> Rig:
    return Rig(memory_store)


def _dead_worker_run(rig: Rig, ttl: float = 10.0) -> str:
    """A run whose worker claimed its first step, then died (its lease ``ttl`` s)."""
    run = insert_run(rig.store, "r1")
    assert run.current is not None
    claim = transitions.claim(run, run.current, worker="dead/1", now=rig.clock.now(), ttl=ttl)
    rig.store.checkpoint(claim)
    return run.run_id


def test_reads_call_out_a_run_whose_lease_lapsed_with_no_sweep_since(rig: Rig) -> None:
    reads = Reads(rig.store, rig.clock, running_alert=900.0, sweep_interval=5.0)
    recovery.sweep(rig.runtime("beat"), kind=SweepKind.BEAT)  # before the lease lapsed: no help
    run_id = _dead_worker_run(rig, ttl=10.0)
    rig.clock.advance(10 + 5)  # lapsed a sweep interval ago: a sweep is due any moment
    assert reads.attention(rig.load(run_id)) is None
    rig.clock.advance(57)
    assert reads.attention(rig.load(run_id)) == "unswept"
    shown = reads.run_detail(run_id).to_dict()
    assert (shown["attention"], shown["attention_detail"]) == ("unswept", UNSWEPT)
    assert reads.listed(rig.load(run_id))["attention_detail"] == UNSWEPT
    recovery.sweep(rig.runtime("cli"))  # `harness sweep`: it re-sends the run
    assert reads.attention(rig.load(run_id)) is None


def test_stats_say_how_old_the_last_sweep_is(rig: Rig) -> None:
    reads = Reads(rig.store, rig.clock, running_alert=900.0, sweep_interval=5.0)
    stats = reads.stats()
    assert stats["last_sweep_age_s"] is None and stats["beat_sweep_age_s"] is None
    recovery.sweep(rig.runtime("beat"), kind=SweepKind.BEAT)
    rig.clock.advance(30)
    recovery.sweep(rig.runtime("w1@host:9"), kind=SweepKind.WORKER)
    rig.clock.advance(2.5)
    stats = reads.stats()
    assert stats["last_sweep_age_s"] == 2.5 and stats["last_sweep_kind"] == "worker"
    assert stats["beat_sweep_age_s"] == 32.5 and stats["sweep_interval_seconds"] == 5.0


def test_a_step_left_running_in_a_run_that_ended_is_abandoned(rig: Rig) -> None:
    reads = Reads(rig.store, rig.clock, running_alert=900.0)
    run_id = _dead_worker_run(rig)
    running = reads.run_detail(run_id).to_dict()["steps"]
    assert isinstance(running, list) and running[0] == {**running[0], "abandoned": False}
    rig.store.checkpoint(transitions.cancel(rig.load(run_id), "enough", now=rig.clock.now()))
    (step,) = reads.run_detail(run_id).to_dict()["steps"]  # type: ignore[misc]
    assert isinstance(step, dict)
    assert (step["status"], step["abandoned"]) == ("running", True)  # stored as last recorded
    page = reads.steps_page(run_id).to_dict()["steps"]
    assert isinstance(page, list) and page[0] == step
