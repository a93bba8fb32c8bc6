"""Child runs: a call that starts a run of another agent, and that run's
end as the call's answer (``harness.agent_tool``, ``ctx.start_child``),
around :mod:`harness.engine.waits` (the waiting itself) and the pure
transitions of :mod:`harness.engine.transitions.waits`.

A child's id is ``{parent_run_id}:{step_index}``, so a retried call finds
the child it started instead of starting another; its budgets are what its
parent has left. Its end answers the parent's step in the wake of the
child's last checkpoint (:func:`ended`), the sweeper's look at the waiting
parent making up for an answer lost with its process; a parent that ends
otherwise than completed cancels the children still going. :class:`Hooks`
is what a worker gives a tool's context: these, and its callback URL.
"""

from __future__ import annotations

import logging

from harness import callbacks
from harness.agents import get_agent
from harness.engine import billing, creation, gates
from harness.engine.runtime import Runtime, commit
from harness.engine.transitions import operator as op_transitions
from harness.engine.transitions import waits as transitions
from harness.engine.waits import wake_if_ready
from harness.errors import AgentNotFound, RunNotFound, StaleWriteError, ToolError
from harness.inputs import MAX_GOAL, checked_text
from harness.records import ParentRef, Run, RunStatus
from harness.tools import ToolContext
from harness.waiting import Deferred, seconds

log = logging.getLogger(__name__)


def child_ended(rt: Runtime, child_id: str) -> None:
    """``child_id`` has ended: its end is the answer of the parent's step
    that started it (once), and the parent moves on if that was the last."""
    try:
        child = rt.store.load(child_id)
    except RunNotFound:
        return
    if child.parent is None or not child.status.terminal:
        return
    parent = child.parent
    try:
        found = rt.store.steps(parent.run_id, parent.step, 1)
    except RunNotFound:
        return
    if not found or found[0].wait is None or found[0].wait.child != child_id:
        return
    completion = transitions.child_answer(found[0], child, worker=rt.worker_id, now=rt.clock.now())
    if rt.store.complete_deferred(completion):
        wake_if_ready(rt, parent.run_id)


def ended(rt: Runtime, run: Run, status: object) -> None:
    """A checkpoint of ``run`` (as loaded) ended it with ``status``: if it is a
    child, answer its parent; if it ended otherwise than completed, cancel
    the children its calls started (a completed run has none left going).
    Never raises: the sweeper's look at a waiting parent makes up for an
    answer lost here."""
    if not isinstance(status, RunStatus) or not status.terminal:
        return
    try:
        if run.parent is not None:
            rt.crash("before_parent_answered", "child")
            child_ended(rt, run.run_id)
        if status is not RunStatus.COMPLETED:
            cancel_children(rt, run.run_id, f"its parent {run.run_id} {status.value}")
    except Exception as err:
        log.warning("run=%s its end not passed on now: %s", run.run_id, err)


def cancel_children(rt: Runtime, run_id: str, reason: str) -> None:
    """Cancel the runs ``run_id``'s calls started that have not ended, and theirs."""
    for child in rt.store.children(run_id):
        while not child.status.terminal:
            try:
                commit(rt, op_transitions.cancel(child, reason, now=rt.clock.now()))
            except StaleWriteError:
                child = rt.store.load(child.run_id)  # it moved: look again
                continue
            billing.bill_recorded(rt, rt.store.load(child.run_id))
            cancel_children(rt, child.run_id, f"its parent {child.run_id} was cancelled")
            break


def child_budget(rt: Runtime, parent: Run) -> tuple[int | None, float | None]:
    """A child's budgets: what its parent has left (its own budgets less what
    it and its children still running have used). ToolError if nothing is left."""
    try:
        agent = get_agent(parent.agent)
    except AgentNotFound:
        return parent.max_tokens, parent.max_cost_usd
    max_tokens, max_cost = gates.budgets(agent, parent)
    if max_tokens is None and max_cost is None:
        return None, None
    live = [c for c in rt.store.children(parent.run_id) if not c.status.terminal]
    tokens = None
    if max_tokens is not None:
        used = parent.input_tokens + parent.output_tokens
        used += sum(c.input_tokens + c.output_tokens for c in live)
        tokens = max_tokens - used
        if tokens < 1:
            raise ToolError(
                f"run {parent.run_id} has no tokens left for a child (max_tokens={max_tokens})"
            )
    cost = None
    if max_cost is not None:
        cost = max_cost - parent.cost_usd - sum(c.cost_usd for c in live)
        if cost <= 0:
            raise ToolError(
                f"run {parent.run_id} has no budget left for a child (max_cost_usd={max_cost:g})"
            )
    return tokens, cost


class Hooks:
    """What a worker gives a tool's context (``ToolContext.callback_url``,
    ``start_child``), on this runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def callback_url(self, ctx: ToolContext, expires_in: float | None) -> str:
        ttl = callbacks.DEFAULT_EXPIRY if expires_in is None else seconds(expires_in, "expires_in")
        claim = callbacks.CallbackClaim(
            ctx.run_id, ctx.step_index, ctx.attempt, self.rt.clock.now() + ttl
        )
        return callbacks.url(self.rt.public_url, callbacks.sign(self.rt.callback_secret, claim))

    def start_child(self, ctx: ToolContext, agent: str, goal: str) -> Deferred:
        rt = self.rt
        child_id = f"{ctx.run_id}:{ctx.step_index}"
        if len(child_id) > 128:
            raise ToolError(f"a child of run {ctx.run_id} would have an id over 128 characters")
        goal = checked_text(goal, "task", MAX_GOAL)
        ref = ParentRef(ctx.run_id, ctx.step_index)
        try:  # started by an earlier attempt of this call: the same child, as it is
            if rt.store.load(child_id).parent == ref:
                return Deferred(child=child_id)
        except RunNotFound:
            pass
        parent = rt.store.load(ctx.run_id)
        tokens, cost = child_budget(rt, parent)
        creation.create(rt, agent, goal, child_id, parent=ref, max_tokens=tokens, max_cost_usd=cost)
        # A cancel that listed the parent's children before this one existed:
        # the child is cancelled here instead (one of the two sees the other).
        parent = rt.store.load(ctx.run_id)
        if parent.status.terminal:
            cancel_children(rt, ctx.run_id, f"its parent {ctx.run_id} {parent.status.value}")
            raise ToolError(f"run {ctx.run_id} {parent.status.value} as its child started")
        return Deferred(child=child_id)
