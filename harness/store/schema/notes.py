"""Writes beside the version (harness.store.RunNotes): a pause asked for, an
approval given ahead, a late model call's charge. Each is guarded by its own
WHERE clause instead of the version, so a step in flight is not fenced.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.sql import Select, Update

from harness.records import RunStatus, StepKind, StepStatus
from harness.store.schema.tables import TERMINAL, runs, steps


def request_pause(run_id: str, requested: bool, statuses: frozenset[RunStatus]) -> Update:
    """Ask a run to stop at its next step boundary (or withdraw the ask) while
    its status is one of ``statuses`` (harness.store.PauseNote); the version
    is not moved, so a step in flight is not fenced."""
    return (
        update(runs)
        .where(
            runs.c.run_id == run_id,
            runs.c.status.in_(sorted(s.value for s in statuses)),
            runs.c.pause_requested.is_not(requested),
        )
        .values(pause_requested=requested)
    )


def note_approval(run_id: str, index: int, status: StepStatus, values: dict[str, Any]) -> Update:
    """An operator's word on a call not reached yet, while it is ``status``
    (harness.store.ApprovalNote): recorded once (a second word matches no
    row), without moving the run's version."""
    return (
        update(steps)
        .where(
            steps.c.run_id == run_id,
            steps.c.idx == index,
            steps.c.status == status.value,
            steps.c.approval.is_(None),
        )
        .values(**values)
    )


def late_result(run_id: str, index: int, values: dict[str, Any]) -> Update:
    """The response of a model call that returned after its run ended, on its
    step: only while the run has ended and the step has no result yet, so that
    a call is charged once (a second writer matches no row)."""
    ended = exists().where(runs.c.run_id == run_id, runs.c.status.in_(TERMINAL))
    return (
        update(steps)
        .where(
            steps.c.run_id == run_id,
            steps.c.idx == index,
            steps.c.kind == StepKind.MODEL.value,
            steps.c.result.is_(None),
            steps.c.result_blob.is_(None),
            ended,
        )
        .values(**values)
    )


def add_usage(run_id: str, input_tokens: int, output_tokens: int, cost_usd: float) -> Update:
    """Add a call's usage to the run's, without moving its version."""
    return (
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(
            input_tokens=runs.c.input_tokens + input_tokens,
            output_tokens=runs.c.output_tokens + output_tokens,
            cost_usd=runs.c.cost_usd + cost_usd,
        )
    )


def run_version(run_id: str) -> Select[Any]:
    return select(runs.c.version).where(runs.c.run_id == run_id)
