"""``harness replay``: run a recorded run again under another agent, for evaluation.

A replay is a new run, marked ``replay_of`` its recording, carried by the
workers like any run, so it survives what any run survives. Its model turns
are live (that is what is being evaluated: a new model, prompt or tool
version); its tool calls are served from the recording
(harness.engine.cassette), so replaying a thousand runs that refunded
orders refunds nothing. The comparison is :mod:`harness.replay.report`.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from harness import observability
from harness.agents import get_agent
from harness.engine import creation, transitions
from harness.engine.runtime import Runtime, dispatch
from harness.errors import NotReplayable
from harness.records import Run, RunStatus
from harness.store import RunQuery, Store, encode_cursor

#: Runs read per page when a batch selects its recordings.
PAGE = 500


def replay_run(
    rt: Runtime,
    run_id: str,
    agent: str,
    *,
    live_read_only: bool = False,
    new_run_id: str | None = None,
) -> str:
    """Create the replay of ``run_id`` under ``agent`` and dispatch its first
    step; return its id. Idempotent on an explicit ``new_run_id`` (that same
    replay is left as it is; any other run there is a RunConflict).
    Raises RunNotFound, NotReplayable (the run has not ended, or is a replay
    itself), AgentNotFound."""
    origin = rt.store.load(run_id)
    if origin.replay_of is not None:
        # Its steps are served answers and refusals, not a recording of calls.
        raise NotReplayable(
            f"run {run_id} is a replay of {origin.replay_of.run_id}: replay that run instead"
        )
    if not origin.status.terminal:
        raise NotReplayable(
            f"run {run_id} is {origin.status.value}: a replay needs a run that has ended, "
            "so that its recording is whole"
        )
    get_agent(agent)
    now = rt.clock.now()
    run, steps = transitions.replay(
        origin,
        run_id=new_run_id or uuid.uuid4().hex,
        agent=agent,
        live_read_only=live_read_only,
        now=now,
    )
    stored, created = rt.store.create_run(
        run, steps, wake_at=now + rt.lease_ttl, created=transitions.created(run)
    )
    if not created:
        creation.refuse_other(stored, run)
    else:
        observability.created(stored.run_id, agent, stored.version, rt.worker_id)
        dispatch(rt, stored.run_id, 0)
    return stored.run_id


def recordings(
    store: Store,
    *,
    agent: str | None,
    status: RunStatus | None,
    since: float | None,
    limit: int,
) -> list[Run]:
    """The runs a batch replays: newest first, at most ``limit``, never a
    replay itself; of ``agent`` (any if None), ended with ``status`` (any
    ended status if None), created at ``since`` or later."""
    chosen: list[Run] = []
    query = RunQuery(status=status, agent=agent, created_after=since, replays=False)
    while len(chosen) < limit:
        page = store.query_runs(query, PAGE)
        chosen.extend(r for r in page if r.status.terminal)
        if len(page) < PAGE:
            break
        query = replace(query, cursor=encode_cursor(page[-1]))
    return chosen[:limit]
