"""Creating a run: the one create rule every door goes through.

The public API (harness.api), the web app, a fork and a replay all create
runs here or by :func:`refuse_other`: an explicit ``run_id`` that holds the
same run already is left as it is, one that holds another is a
:class:`~harness.errors.RunConflict`. Creation writes the run with its first
model step (harness.engine.transitions.new_run decides both, and the
creation event) and dispatches that step.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from harness import catalog, observability
from harness.engine import transitions
from harness.engine.runtime import Runtime, dispatch
from harness.errors import AgentNotFound, RunConflict, RunNotFound
from harness.records import ParentRef, Run


def create_run(rt: Runtime, agent_name: str, goal: str, run_id: str | None = None) -> str:
    """Create a run with its first model step, then dispatch it; its id.
    Idempotent on an explicit ``run_id`` (see :func:`create`)."""
    return create(rt, agent_name, goal, run_id)[0].run_id


def create(
    rt: Runtime,
    agent_name: str,
    goal: str,
    run_id: str | None = None,
    *,
    parent: ParentRef | None = None,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
) -> tuple[Run, bool]:
    """Create a run with its first model step, then dispatch it: (the run,
    True). An explicit ``run_id`` that holds this same run (the agent and
    goal) already is left as it is: (that run, False); one that holds
    another is a :class:`RunConflict` (:func:`refuse_other`). The agent must
    be registered here or carried by a live worker (harness.catalog); its
    code is needed only where a worker runs it."""
    now = rt.clock.now()
    run, steps = transitions.new_run(run_id or uuid.uuid4().hex, agent_name, goal, now)
    if parent is not None:  # a child run (harness.engine.waits), its budget its parent's rest
        run = replace(run, parent=parent, max_tokens=max_tokens, max_cost_usd=max_cost_usd)
    try:
        catalog.require(rt.store, agent_name, now)
    except AgentNotFound:
        if run_id is None:
            raise
        existing = _existing(rt, run_id)  # no worker carries it now: a repeat is still a no-op
        if existing is None:
            raise
        refuse_other(existing, run)
        return existing, False
    stored, created = rt.store.create_run(
        run, steps, wake_at=now + rt.lease_ttl, created=transitions.created(run)
    )
    if not created:
        # Also when our own insert committed and only its reply was lost (the
        # retry met the row): then no message is sent now, and the sweeper
        # starts the run one lease TTL later (its wake_at).
        refuse_other(stored, run)
        return stored, False
    observability.created(run.run_id, agent_name, stored.version, rt.worker_id)
    dispatch(rt, run.run_id, 0)
    return stored, True


def _existing(rt: Runtime, run_id: str) -> Run | None:
    try:
        return rt.store.load(run_id)
    except RunNotFound:
        return None


def refuse_other(stored: Run, asked: Run) -> None:
    """Raise :class:`RunConflict` unless ``stored``, found under ``asked``'s
    id when ``asked`` was inserted, is the run asked for: the same agent and
    goal, and the same origin (a fork's, a replay's). The one rule for every
    create with an explicit id; compared with what the store holds after the
    insert lost, never with a read before it, so of two racing creates one
    wins and the other is told what won."""
    if (stored.agent, stored.goal, stored.forked_from, stored.replay_of, stored.parent) == (
        asked.agent,
        asked.goal,
        asked.forked_from,
        asked.replay_of,
        asked.parent,
    ):
        return
    goal = stored.goal if len(stored.goal) <= 80 else stored.goal[:79] + "…"
    what = f"agent {stored.agent} and goal {goal!r}"
    if stored.forked_from is not None:
        what += f", forked from {stored.forked_from.run_id} at step {stored.forked_from.step}"
    if stored.replay_of is not None:
        what += f", a replay of {stored.replay_of.run_id}"
        what += " with live read_only calls" * stored.replay_of.live_read_only
    raise RunConflict(f"run {stored.run_id} exists with {what}: another run, not created", stored)
