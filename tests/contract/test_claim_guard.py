"""The claim guard's two forms agree (issue 22, item 1): the definition,
:meth:`harness.store.ClaimGuard.holds` on a loaded run, and the SQL guard a
store writes a claim on a hint under (``schema.claim_guard``), on a table of
states, on every backend. A claim lands exactly where ``holds`` says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from harness.engine import transitions
from harness.records import ReplayOrigin, Run, RunStatus, Step, StepKind, StepStatus
from harness.store import Checkpoint, ClaimGuard, RunPatch, StepPatch
from harness.store.sql import SQLStore

NOW = 1_000.0
#: The state a model turn leaves for the idempotent call it asked for, at step 1.
GUARD = ClaimGuard(cursor=1, agent="agent", tool="put", attempts=0)

#: (id, run row changes, step 1 changes, guard changes): one difference each.
STATES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("as-the-hint-says", {}, {}, {}),
    ("leased", {"owner": "w/1", "lease_expires_at": NOW + 30}, {}, {}),
    ("marked-by-the-sweeper", {"owner": transitions.SWEEPER}, {}, {}),
    ("asked-to-pause", {"pause_requested": True}, {}, {}),
    ("paused", {"status": RunStatus.PAUSED}, {}, {}),
    ("waiting", {"status": RunStatus.WAITING}, {}, {}),
    ("pending", {"status": RunStatus.PENDING}, {}, {}),
    ("completed", {"status": RunStatus.COMPLETED}, {}, {}),
    ("cursor-elsewhere", {"cursor": 2}, {}, {}),
    ("step-running", {}, {"status": StepStatus.RUNNING}, {}),
    ("step-awaiting-approval", {}, {"status": StepStatus.AWAITING_APPROVAL}, {}),
    ("step-attempted", {}, {"attempts": 1}, {}),
    ("another-agent", {}, {}, {"agent": "other"}),
    ("another-tool", {}, {}, {"tool": "peek"}),
    ("other-attempts", {}, {}, {"attempts": 2}),
    ("guard-at-another-cursor", {}, {}, {"cursor": 0}),
]


def _stored(store: SQLStore, run_id: str, run_changes: dict[str, Any], step: dict[str, Any]) -> Run:
    """A run at its model turn's end (cursor 1: a pending call of ``put``),
    then changed as the case says."""
    run = Run(
        run_id, "agent", "goal", RunStatus.RUNNING, cursor=1, version=1, step_count=3,
        created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    steps = [
        Step(run_id, 0, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 0}, result={}),
        Step(run_id, 1, StepKind.TOOL, StepStatus.PENDING, tool="put", args={"n": 1}),
        Step(run_id, 2, StepKind.MODEL, StepStatus.PENDING, args={"turn": 1}),
    ]
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    if run_changes or step:
        patch = Checkpoint(
            run_id,
            1,
            "test",
            NOW,
            run=RunPatch(**run_changes),
            steps=(StepPatch(1, **step),) if step else (),
        )
        store.checkpoint(patch)
    return store.load(run_id)


@pytest.mark.parametrize(
    ("name", "run_changes", "step", "guarded"), STATES, ids=[s[0] for s in STATES]
)
def test_a_claim_lands_exactly_where_the_guard_holds(
    store: SQLStore,
    name: str,
    run_changes: dict[str, Any],
    step: dict[str, Any],
    guarded: dict[str, Any],
) -> None:
    run = _stored(store, f"r-{name}", run_changes, step)
    guard = replace(GUARD, **guarded)
    claim = transitions.claim_pending(
        run.run_id, run.version, guard.cursor, guard.attempts, worker="w/2", now=NOW, ttl=30.0
    )
    landed = store.claim_loaded(claim, guard) is not None
    assert landed is guard.holds(run, run.version)
    assert landed is (name == "as-the-hint-says")


def test_a_replay_is_never_claimed_on_a_hint(store: SQLStore) -> None:
    """A replay's calls are served from its recording: its run row names it."""
    run = Run(
        "r-replay", "agent", "goal", RunStatus.RUNNING, cursor=1, version=1, step_count=2,
        created_at=NOW, updated_at=NOW, replay_of=ReplayOrigin("r0"),
    )  # fmt: skip
    steps = [
        Step(run.run_id, 0, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 0}, result={}),
        Step(run.run_id, 1, StepKind.TOOL, StepStatus.PENDING, tool="put", args={"n": 1}),
    ]
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    loaded = store.load(run.run_id)
    claim = transitions.claim_pending(
        run.run_id, loaded.version, 1, 0, worker="w/2", now=NOW, ttl=30.0
    )
    assert GUARD.holds(loaded, loaded.version) is False
    assert store.claim_loaded(claim, GUARD) is None


def test_a_claim_at_another_version_never_lands(store: SQLStore) -> None:
    run = _stored(store, "r-version", {}, {})
    claim = transitions.claim_pending(
        run.run_id, run.version - 1, 1, 0, worker="w/2", now=NOW, ttl=30.0
    )
    assert GUARD.holds(run, run.version - 1) is False
    assert store.claim_loaded(claim, GUARD) is None
