"""Which runs the dashboard calls out, and why (harness.reads.attention)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.reads import attention
from harness.records import Run, RunStatus, Step, StepKind, StepStatus

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
