"""The claim hint: what the worker that moved a run on tells the next one, so
that it can claim the next step without loading the run first.

Its header format (:class:`ClaimHint`), which calls may be claimed on it
(:func:`may_claim`), the hint for the message of a step a checkpoint just
made (:func:`hint_for`), and the guard its claim is written under
(:func:`guard`). The guard's state is defined once, by
:class:`harness.store.ClaimGuard`. Its own module because both ends need
it and neither owns it: the runner makes and reads it, the Celery layer
carries it in a message header (``harness.celery.config``), and
:class:`harness.engine.runtime.Sender` names it in its signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.agents import Agent
from harness.records import Run, Step
from harness.store import ClaimGuard
from harness.tools import ToolEffect

#: The integer columns' bound (PostgreSQL's ``integer``).
_INT_COLUMN = 2**31


@dataclass(frozen=True)
class ClaimHint:
    """What the worker that moved a run on knows of it, sent with the next
    step's message so that the next worker can claim that step without
    loading the run first: one round trip instead of two. The version it
    committed, the run's agent, and the tool and attempts of the call at the
    new cursor. Only a hint: the claim lands only if the run is still in that
    state (:class:`harness.store.ClaimGuard`); otherwise the run is loaded and
    the message handled as if it had none. Sent in a message header, which a
    worker of an earlier release ignores."""

    version: int
    agent: str
    tool: str
    attempts: int

    #: The message header that carries it.
    HEADER = "harness_claim"

    def header(self) -> list[int | str]:
        """The header's value: a JSON list, the fields in order."""
        return [self.version, self.agent, self.tool, self.attempts]

    @classmethod
    def from_header(cls, value: object) -> ClaimHint | None:
        """The hint in a header's value; None if there is none or it is not one."""
        if not isinstance(value, list | tuple) or len(value) != 4:
            return None
        version, agent, tool, attempts = value
        if not (isinstance(agent, str) and isinstance(tool, str)):
            return None
        if not all(type(n) is int and 0 <= n < _INT_COLUMN for n in (version, attempts)):
            return None  # not a version the store could hold: from no sender of ours
        return cls(version, agent, tool, attempts)


def may_claim(agent: Agent, index: int, tool: str | None) -> bool:
    """May step ``index``, a call of ``tool``, be claimed on a hint? Only where a
    load, finding the run as the guard requires, is sure to end in that same
    claim: for an idempotent tool that needs no approval (always checkpointed
    RUNNING; an ``at_most_once`` one keeps the load's care about a lost
    reply), under the step limit, for an agent without a deadline (the run's
    age needs a load). The tool's effect and approval are this worker's
    registry's, never the sender's."""
    return (
        tool is not None
        and agent.tool_effect(tool) is ToolEffect.IDEMPOTENT
        and not agent.needs_approval(tool)
        and index < agent.max_steps
        and agent.deadline is None
    )


def hint_for(
    agent: Agent, run: Run, version: int, cursor: int, new: tuple[Step, ...]
) -> ClaimHint | None:
    """The hint for the message of step ``cursor``, once the checkpoint that
    made ``new`` steps committed ``version``: when that step is one of them
    and may be claimed on it. A replay's calls are served, not claimed."""
    step = next((s for s in new if s.index == cursor), None)
    if step is None or step.tool is None or run.replay_of is not None:
        return None
    if not may_claim(agent, cursor, step.tool):
        return None
    return ClaimHint(version, run.agent, step.tool, step.attempts)


def guard(hint: ClaimHint, cursor: int) -> ClaimGuard:
    """The state the claim of step ``cursor`` on ``hint`` must find."""
    return ClaimGuard(cursor, hint.agent, hint.tool, hint.attempts)
