"""Serving a replay's tool calls from the run it replays.

A replay is a new run of another agent (a new model, prompt or tool
version) on a recorded run's goal. Its model turns are live; its tool calls
are not. A call with the tool name and arguments of the recorded call at
the same position (step index) is answered with the recorded outcome, the
result or the failure, and the tool is never called. A call that differs,
or that has no recorded call at its position, has left the recording:

- by default the replay stops there (:class:`~harness.errors.Diverged`;
  the run ends ``diverged``);
- with ``live_read_only`` the call is made live when its tool is
  ``read_only`` (and needs no approval). An ``idempotent`` or
  ``at_most_once`` tool is never called by a replay, whatever the mode.

Positions line up as long as the replay follows its recording: each model
turn's calls become the steps after it, so the same calls land at the same
indexes. Where they stop lining up is what the report shows
(:mod:`harness.replay.report`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from harness.engine.executor import Called, StepExecutor
from harness.engine.leases import Lease
from harness.errors import Diverged, RecordedToolError, RunNotFound
from harness.records import JSON, ReplayOrigin, Step, StepKind, StepStatus
from harness.tools import ToolEffect, ToolSpec, WaitHooks

log = logging.getLogger(__name__)

#: How a replay's tool call was answered: the detail of its step's event in
#: the flight recorder, which the report counts (harness.replay.report).
SERVED = "served from the recording"
LIVE = "made live: read_only, off the recording"


def asked_for(step: Step) -> dict[str, JSON]:
    """The arguments the model asked for at a recorded tool step: an operator
    who approved the call with other arguments changed what ran, not what
    was asked (``approval.proposed_args``)."""
    proposed = None if step.approval is None else step.approval.proposed_args
    return step.args if proposed is None else proposed


def same_call(recorded: Step | None, tool: str | None, args: dict[str, JSON]) -> bool:
    """Does ``recorded`` hold a call of ``tool`` with exactly ``args``?"""
    if recorded is None or recorded.kind is not StepKind.TOOL or recorded.tool != tool:
        return False
    return _canonical(asked_for(recorded)) == _canonical(args)


def describe_call(step: Step | None) -> str:
    """``name({"arg": ...})``, or what stands at that position instead."""
    if step is None:
        return "nothing (the recording ended before it)"
    if step.kind is StepKind.MODEL:
        return "a model turn"
    return f"{step.tool}({json.dumps(asked_for(step), sort_keys=True)})"


def _canonical(value: JSON) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Cassette(StepExecutor):
    """The tool executor of a replay: recorded outcomes where the calls match,
    the live executor (``live``) only for a ``read_only`` call that diverged,
    and only in ``live_read_only`` mode. Lease renewals go to ``live`` too."""

    def __init__(self, live: StepExecutor, origin: ReplayOrigin) -> None:
        super().__init__(live.store, live.cache, live.claim_ttl, live.crash)
        self.live = live
        self.origin = origin

    def execute(
        self,
        spec: ToolSpec,
        step: Step,
        kwargs: dict[str, Any],
        *,
        lease: Lease,
        recovered: bool,
        namespace: str,
        hooks: WaitHooks | None = None,
    ) -> Called:
        try:
            found = self.store.steps(self.origin.run_id, step.index, 1)
        except RunNotFound:  # pruned while its step (a blob) was read
            found = []
        recorded = found[0] if found else None
        if same_call(recorded, spec.name, step.args):
            assert recorded is not None
            return _served(recorded, step)
        if recorded is None and self._gone():
            raise Diverged(
                f"step {step.index}: the recording {self.origin.run_id} no longer exists "
                "(pruned?), so there is nothing to serve; not called"
            )
        where = (
            f"step {step.index} left the recording of {self.origin.run_id}: it calls "
            f"{spec.name}({json.dumps(step.args, sort_keys=True)}) where the recording has "
            f"{describe_call(recorded)}"
        )
        if not self.origin.live_read_only:
            raise Diverged(f"{where}; not called")
        if spec.effect is not ToolEffect.READ_ONLY or spec.requires_approval:
            why = "it needs approval" if spec.requires_approval else f"it is {spec.effect.value}"
            raise Diverged(f"{where}; not called: {why}, and a replay calls only read_only tools")
        log.info("run=%s %s; called live (read_only)", step.run_id, where)
        called = self.live.execute(
            spec, step, kwargs, lease=lease, recovered=recovered, namespace=namespace, hooks=hooks
        )
        return Called(called.result, called.record, LIVE)

    def renew(self, step: Step, namespace: str, lease: Lease) -> None:
        self.live.renew(step, namespace, lease)

    def _gone(self) -> bool:
        try:
            self.store.load(self.origin.run_id)
        except RunNotFound:
            return True
        return False


def _served(recorded: Step, step: Step) -> Called:
    """The recorded outcome of the same call: its result, or its failure
    (a tool error, an operator's rejection) raised as the tool's error."""
    if recorded.status is StepStatus.DONE:
        log.info("run=%s step=%d served from the recording", step.run_id, step.index)
        return Called(recorded.result, note=SERVED)
    if recorded.status is StepStatus.FAILED:
        error = recorded.error or "failed in the recording"
        raise RecordedToolError(error, SERVED, answered=recorded.wait is not None)
    # Recorded, but never settled (in doubt, awaiting approval when the run was cancelled).
    raise Diverged(
        f"step {step.index}: the recorded call {describe_call(recorded)} never settled "
        f"({recorded.status.value}), so there is no outcome to serve"
    )
