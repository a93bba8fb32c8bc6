"""Typed records that travel between modules: runs, steps, events."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

JSON = Any  # a value json.dumps accepts


def idempotency_key(run_id: str, step_index: int) -> str:
    """The key of a step's side effect, ``"{run_id}:{step_index}"``: the same on
    every attempt, passed to the tool so a downstream service can dedupe on it."""
    return f"{run_id}:{step_index}"


class RunStatus(StrEnum):
    """Where a run is in its life. Terminal: completed, failed, cancelled,
    diverged (a replay that stopped where it left its recording)."""

    PENDING = "pending"
    RUNNING = "running"
    #: An operator must act (an in-doubt step, an approval), or the world must:
    #: a deferred call's answer, a signal, a sleep, a child run.
    WAITING = "waiting"
    PAUSED = "paused"  # by an operator, or by its budget: `harness resume` moves it on
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DIVERGED = "diverged"

    @property
    def terminal(self) -> bool:
        return self in (
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.DIVERGED,
        )

    @property
    def held(self) -> bool:
        """Stopped until an operator acts: waiting or paused."""
        return self in (RunStatus.WAITING, RunStatus.PAUSED)

    @property
    def movable(self) -> bool:
        """A worker should carry this run forward."""
        return self in (RunStatus.PENDING, RunStatus.RUNNING)


class StepStatus(StrEnum):
    """A step's state. RUNNING means "about to execute, or executing"."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    IN_DOUBT = "in_doubt"
    AWAITING_APPROVAL = "awaiting_approval"
    #: The call started something and returned :class:`harness.Deferred` (or
    #: Sleep, or a child run): its result comes later, from outside the worker.
    DEFERRED = "deferred"

    @property
    def settled(self) -> bool:
        """Done or failed: the step will never change again."""
        return self in (StepStatus.DONE, StepStatus.FAILED)


class StepKind(StrEnum):
    MODEL = "model"
    TOOL = "tool"
    #: A message from the user (`harness send`): its text, a turn of the conversation.
    USER = "user"


class WaitKind(StrEnum):
    """What a deferred step waits for."""

    #: A completion: its signed callback URL, `harness complete`, the API.
    CALLBACK = "callback"
    #: A named signal sent to the run (`harness signal`), or a completion.
    SIGNAL = "signal"
    #: Nothing: it wakes at ``until`` (`harness.Sleep`).
    SLEEP = "sleep"
    #: A child run's end (`harness.agent_tool`, ``ctx.start_child``).
    CHILD = "child"


@dataclass(frozen=True)
class Wait:
    """What a deferred step waits for, and until when (JSON in the step's
    ``wait`` column, migration 0014). ``until``: when a callback or signal
    times out, or a sleep wakes (None: no timeout, a child's wait);
    ``timeout``: the seconds the tool asked for, as it asked."""

    kind: WaitKind
    until: float | None = None
    timeout: float | None = None
    signal: str | None = None
    child: str | None = None

    def to_json(self) -> dict[str, JSON]:
        word: dict[str, JSON] = {"kind": self.kind.value, "until": self.until}
        if self.timeout is not None:
            word["timeout"] = self.timeout
        if self.signal is not None:
            word["signal"] = self.signal
        if self.child is not None:
            word["child"] = self.child
        return word

    @classmethod
    def from_json(cls, word: JSON) -> Wait | None:
        """The wait :meth:`to_json` stored; None for what is not one."""
        if not isinstance(word, dict):
            return None
        try:
            kind = WaitKind(str(word.get("kind")))
        except ValueError:
            return None
        until: Any = word.get("until")
        timeout: Any = word.get("timeout")
        signal, child = word.get("signal"), word.get("child")
        return cls(
            kind,
            float(until) if _number(until) else None,
            float(timeout) if _number(timeout) else None,
            signal if isinstance(signal, str) else None,
            child if isinstance(child, str) else None,
        )

    def describe(self) -> str:
        """What a person reads: ``signal 'paid'``, ``child run r1:3``, ..."""
        if self.kind is WaitKind.SIGNAL:
            return f"signal {self.signal!r}"
        if self.kind is WaitKind.CHILD:
            return f"child run {self.child}"
        if self.kind is WaitKind.SLEEP:
            return "a sleep"
        return "a callback"


@dataclass(frozen=True)
class ParentRef:
    """A child run's parent: the run, and the step whose call started the child."""

    run_id: str
    step: int

    def to_dict(self) -> dict[str, JSON]:
        return {"run_id": self.run_id, "step": self.step}


class Verdict(StrEnum):
    """An operator's word on a call that requires approval."""

    APPROVED = "approved"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Approval:
    """An operator's word on a tool call, as its step keeps it (JSON in the
    step's ``approval`` column, the shape of migration 0006): who decided
    what, when, why (a rejection's reason), and, when the operator edited
    the call's arguments, the ones the model had proposed.

    The harness writes every field but the last two; a word imported or
    written by other hands may lack one, or hold something else: what the
    engine cannot read as its field is kept in ``extra`` (a key) or
    ``unreadable`` (a word that is not an object), and written back as it was."""

    decision: Verdict | None
    by: str | None
    at: float | None
    reason: str | None = None
    proposed_args: dict[str, JSON] | None = None
    #: Keys beyond the engine's, or holding what it cannot read, kept as they were.
    extra: Mapping[str, JSON] = field(default_factory=dict)
    #: A stored word that is not a JSON object at all, kept as it was.
    unreadable: JSON = None

    @property
    def rejected(self) -> bool:
        """The call is not to be made: the model is told why instead."""
        return self.decision is Verdict.REJECTED

    def to_json(self) -> JSON:
        """The word as stored and shown: the fields it has, and what was kept."""
        if self.unreadable is not None:
            return self.unreadable
        fields = {
            "decision": None if self.decision is None else self.decision.value,
            "by": self.by,
            "at": self.at,
            "reason": self.reason,
            "proposed_args": self.proposed_args,
        }
        return {**{k: v for k, v in fields.items() if v is not None}, **self.extra}

    @classmethod
    def from_json(cls, word: JSON) -> Approval:
        """The word :meth:`to_json` stored, or any other JSON found in its place."""
        if not isinstance(word, dict):
            return cls(None, None, None, unreadable=word)
        read = {k: v for k, v in word.items() if _APPROVAL_FIELDS.get(k, _unread)(v)}
        decision = read.get("decision")
        return cls(
            None if decision is None else Verdict(decision),
            read.get("by"),
            read.get("at"),
            reason=read.get("reason"),
            proposed_args=read.get("proposed_args"),
            extra={k: v for k, v in word.items() if k not in read},
        )


def _unread(value: JSON) -> bool:
    return False


def _number(value: JSON) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: The fields of a stored word the engine reads, and the values it reads in each.
_APPROVAL_FIELDS: dict[str, Callable[[JSON], bool]] = {
    "decision": lambda v: v in tuple(Verdict),
    "by": lambda v: isinstance(v, str),
    "at": _number,
    "reason": lambda v: isinstance(v, str),
    "proposed_args": lambda v: isinstance(v, dict),
}


@dataclass(frozen=True)
class Step:
    """One row of the steps table."""

    run_id: str
    index: int
    kind: StepKind
    status: StepStatus
    attempts: int = 0
    tool: str | None = None
    args: dict[str, JSON] = field(default_factory=dict)
    result: JSON = None
    error: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    #: Transient model failures retried so far (429, 5xx, timeouts): not
    #: interruptions, so they do not count towards ``attempts``.
    retries: int = 0
    #: An operator's word on a tool that requires approval.
    approval: Approval | None = None
    #: What a deferred call waits for (kept once it has its answer).
    wait: Wait | None = None

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.run_id, self.index)

    def to_dict(self) -> dict[str, JSON]:
        step: dict[str, JSON] = {
            "index": self.index,
            "kind": self.kind.value,
            "status": self.status.value,
            "attempts": self.attempts,
            "retries": self.retries,
            "tool": self.tool,
            "args": self.args,
            "result": self.result,
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
        if self.kind is StepKind.TOOL:
            step["approval"] = None if self.approval is None else self.approval.to_json()
            step["wait"] = None if self.wait is None else self.wait.to_json()
        if self.kind is StepKind.MODEL:
            # What the provider reported for the turn, and what it cost.
            result = self.result if isinstance(self.result, dict) else {}
            step["usage"] = result.get("usage") or {"input_tokens": 0, "output_tokens": 0}
            step["cost_usd"] = result.get("cost_usd")
        return step


@dataclass(frozen=True)
class ForkOrigin:
    """Where a fork came from: the run whose steps before ``step`` it copied,
    and the model step it continued from, live."""

    run_id: str
    step: int

    def to_dict(self) -> dict[str, JSON]:
        return {"run_id": self.run_id, "step": self.step}


@dataclass(frozen=True)
class ReplayOrigin:
    """What a replay re-runs: the recorded run whose tool calls it is served
    from; ``live_read_only``: a call that leaves the recording is still made
    when its tool is ``read_only`` (otherwise the replay stops there)."""

    run_id: str
    live_read_only: bool = False

    def to_dict(self) -> dict[str, JSON]:
        return {"run_id": self.run_id, "live_read_only": self.live_read_only}


@dataclass(frozen=True)
class Run:
    """One row of the runs table, optionally with the step at its cursor."""

    run_id: str
    agent: str
    goal: str
    status: RunStatus
    cursor: int
    version: int
    step_count: int
    owner: str | None = None
    lease_expires_at: float | None = None
    wake_at: float | None = None
    result: str | None = None
    error: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    #: Sweeper re-sends since the run last moved; they space out exponentially.
    resends: int = 0
    #: Why no worker could carry the run (an agent not registered, no runnable
    #: step), recorded once; cleared when it moves again.
    blocked: str | None = None
    #: Tokens the provider reported, summed over the run's model steps, and
    #: their price from the price table (HARNESS_PRICES).
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    #: This run's budgets, raised by `harness resume` (None: the agent's).
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    #: An operator asked to pause it: it stops at its next step boundary.
    pause_requested: bool = False
    #: Set on a fork (`harness fork`), never changed after; None otherwise.
    forked_from: ForkOrigin | None = None
    #: Set on a replay (`harness replay`), never changed after; None otherwise.
    replay_of: ReplayOrigin | None = None
    #: Set on a child run (`harness.agent_tool`), never changed after.
    parent: ParentRef | None = None
    #: The first step deferred since the run last went past a model turn: its
    #: next model turn waits until every deferred step from here has its answer.
    deferred_from: int | None = None
    #: A user's message waits for the next model turn since then (`harness send`).
    inbox_at: float | None = None
    #: The step limit, raised by `harness resume --max-steps` (None: the agent's).
    max_steps: int | None = None
    #: A nonce the store made as it inserted the row, never exported: another
    #: run under the same id (pruned and imported again, made again) has
    #: another. None for a row made before migration 0017. The store's own,
    #: so not in :meth:`to_dict`.
    incarnation: str | None = None
    current: Step | None = None

    @property
    def lineage(self) -> str:
        """What tells this run from any other that had its id: its
        incarnation, or the creation time of a row made before there were
        any (which an import keeps: a weaker tell)."""
        return self.incarnation or f"{self.created_at:.6f}"

    def lease_live(self, now: float) -> bool:
        return self.owner is not None and (self.lease_expires_at or 0.0) > now

    @property
    def waits_on_calls(self) -> bool:
        """Waiting at a model turn for the answers of its deferred calls (the
        world, or a timeout, moves it on), not for an operator. Needs the run
        loaded with its step at the cursor."""
        step = self.current
        return (
            self.status is RunStatus.WAITING
            and self.deferred_from is not None
            and step is not None
            and step.kind is StepKind.MODEL
        )

    def to_dict(self) -> dict[str, JSON]:
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "goal": self.goal,
            "status": self.status.value,
            "cursor": self.cursor,
            "version": self.version,
            "step_count": self.step_count,
            "owner": self.owner,
            "lease_expires_at": self.lease_expires_at,
            "wake_at": self.wake_at,
            "result": self.result,
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "resends": self.resends,
            "blocked": self.blocked,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
            "cost_usd": round(self.cost_usd, 6),
            "max_tokens": self.max_tokens,
            "max_cost_usd": self.max_cost_usd,
            "pause_requested": self.pause_requested,
            "forked_from": None if self.forked_from is None else self.forked_from.to_dict(),
            "replay_of": None if self.replay_of is None else self.replay_of.to_dict(),
            "parent": None if self.parent is None else self.parent.to_dict(),
            "deferred_from": self.deferred_from,
            "inbox_at": self.inbox_at,
            "max_steps": self.max_steps,
        }


@dataclass(frozen=True)
class Event:
    """One row of the flight recorder."""

    id: int
    run_id: str
    version: int
    step_index: int | None
    from_status: str | None
    to_status: str
    worker: str | None
    at: float
    detail: str | None = None

    def to_dict(self) -> dict[str, JSON]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "version": self.version,
            "step_index": self.step_index,
            "from": self.from_status,
            "to": self.to_status,
            "worker": self.worker,
            "at": self.at,
            "detail": self.detail,
        }
