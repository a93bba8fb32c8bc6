"""Every transition of a run, as a table of pure cases (issue 22, item 1).

Each case is a run (and its step) built in memory, what happens to it, and
what harness.engine.transitions makes of that: the run's next status, the
step's, and the events with their text; or its refusal. No store, no clock,
no agent registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import pytest

from harness.engine import transitions as t
from harness.engine.transitions import Decision, Happened, StepOutcome
from harness.errors import DecisionConflict, NotResolvable, OperatorError
from harness.models import Usage
from harness.records import (
    Approval,
    ReplayOrigin,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    Verdict,
    Wait,
    WaitKind,
)
from harness.store import (
    KEEP,
    ApprovalNote,
    Checkpoint,
    Completion,
    EventDraft,
    PauseNote,
    StepPatch,
)
from harness.waiting import MAX_WAIT

NOW = 1_000.0
TTL = 30.0
R = RunStatus
S = StepStatus


def tool(status: StepStatus = S.PENDING, index: int = 1, **kw: Any) -> Step:
    return Step("r1", index, StepKind.TOOL, status, tool="pay", args={"amount": 5}, **kw)


def model(status: StepStatus = S.PENDING, index: int = 0, **kw: Any) -> Step:
    return Step("r1", index, StepKind.MODEL, status, args={"turn": 0}, **kw)


def run(status: RunStatus = R.RUNNING, step: Step | None = None, **kw: Any) -> Run:
    current = tool() if step is None else step
    fields: dict[str, Any] = {"cursor": current.index, "version": 7, "step_count": 3}
    fields |= kw
    return Run("r1", "bot", "goal", status, current=current, created_at=NOW - 100, **fields)


def word(
    verdict: Verdict = Verdict.APPROVED, by: str = "alice", at: float = NOW - 1, **kw: Any
) -> Approval:
    return Approval(verdict, by, at, **kw)


class Seen(NamedTuple):
    """What a transition decided: the run's next status and the step's (None:
    left as they are), and its events as (to, from, step, detail)."""

    run: RunStatus | None
    step: StepStatus | None
    events: tuple[tuple[str, str | None, int | None, str | None], ...]


def _events(*drafts: EventDraft) -> tuple[tuple[str, str | None, int | None, str | None], ...]:
    return tuple((str(e.to_status), e.from_status, e.step_index, e.detail) for e in drafts)


def seen(made: object) -> Seen | str:
    """What ``made`` (a checkpoint, a note, a new run, or an action found
    unneeded) decides, comparably."""
    if isinstance(made, t.Unchanged):
        return f"unchanged: {made.said}"
    if isinstance(made, PauseNote):
        return Seen(None, None, _events(made.event))
    if isinstance(made, ApprovalNote):
        return Seen(None, made.while_status, _events(made.event))
    if isinstance(made, Completion):  # an answer beside the version: the run untouched
        return Seen(None, made.status, _events(made.event))
    if isinstance(made, t.Fork):
        return Seen(made.run.status, made.steps[-1].status, _events(made.created))
    if isinstance(made, tuple):  # a new run, its steps and its creation event
        new, steps, event = made
        return Seen(new.status, steps[-1].status, _events(event))
    assert isinstance(made, Checkpoint), made
    status = made.run.status if isinstance(made.run.status, RunStatus) else None
    patch = made.steps[0] if made.steps else StepPatch(-1)
    step = patch.status if isinstance(patch.status, StepStatus) else None
    return Seen(status, step, _events(*made.events))


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], object]
    want: Seen | str | tuple[type[Exception], str]


def _record(
    loaded: Run, outcome: StepOutcome, *, claimed: bool = True, fail: bool = False
) -> Checkpoint:
    step = loaded.current
    assert step is not None
    return t.record(
        loaded,
        step,
        outcome,
        version=loaded.version,
        worker="w",
        now=NOW,
        ttl=TTL,
        claimed=claimed,
        started_at=NOW,
        fail_on_tool_error=fail,
    )


def _created(loaded: Run, steps: list[Step]) -> tuple[Run, list[Step], EventDraft]:
    return loaded, steps, t.created(loaded)


def _resolve(decision: Decision, **kw: Any) -> Checkpoint:
    started = kw.pop("started_at", NOW - 60)
    doubt = tool(S.IN_DOUBT, attempts=1, started_at=started)
    kw = {"fail_run": False, "now": NOW, "ttl": TTL, "step_time_limit": 30.0} | kw
    return t.resolve(run(R.WAITING, doubt), doubt, decision, kw.pop("result", None), **kw)


def _pause_refused(loaded: Run) -> object:
    return t.request_pause(loaded, who="dave", now=NOW)


BOOM = "boom"
ADOPTED = 'operator: retry; the call\'s result had been stored and was adopted: {"id": 9}'
WAITING_STEP = tool(S.AWAITING_APPROVAL)
EDITED = {"amount": 3}

CREATION = [
    Case(
        "create-a-run",
        lambda: _created(*t.new_run("r1", "support", "refund", NOW)),
        Seen(R.PENDING, S.PENDING, (("pending", None, None, "agent=support"),)),
    ),
    Case(
        "create-a-replay",
        lambda: _created(
            *t.replay(run(R.COMPLETED), run_id="r2", agent="b", live_read_only=True, now=NOW)
        ),
        Seen(
            R.PENDING,
            S.PENDING,
            (("pending", None, None, "agent=b; replay of r1; live read_only calls"),),
        ),
    ),
    Case(
        "create-a-fork",
        lambda: t.fork(
            run(R.COMPLETED, model(S.DONE, index=2)),
            [model(S.DONE, result={}), tool(S.DONE), model(index=2)],
            [],
            2,
            run_id="f1",
            agent="bot",
            goal="another goal",
            now=NOW,
        ),
        Seen(
            R.PENDING,
            S.PENDING,
            (("pending", None, None, "forked from r1 at step 2; agent=bot; new goal"),),
        ),
    ),
]

CLAIMS = [
    Case(
        "claim-a-pending-run's-first-step",
        lambda: t.claim(run(R.PENDING, model()), model(), worker="w", now=NOW, ttl=TTL),
        Seen(
            R.RUNNING,
            S.RUNNING,
            (("running", "pending", None, None), ("running", "pending", 0, "attempt 1")),
        ),
    ),
    Case(
        "claim-an-interrupted-step-from-a-lapsed-lease",
        lambda: t.claim(
            run(owner="w-old", step=tool(S.RUNNING, attempts=1)),
            tool(S.RUNNING, attempts=1),
            worker="w",
            now=NOW,
            ttl=TTL,
        ),
        Seen(
            R.RUNNING,
            S.RUNNING,
            (
                ("lease_takeover", None, None, "from w-old"),
                ("recovered_running", None, 1, "attempt 1 was interrupted"),
                ("running", "running", 1, "attempt 2"),
            ),
        ),
    ),
    Case(
        "claim-after-a-back-off-is-no-interruption",
        lambda: t.claim(
            run(owner=t.BACKED_OFF, step=tool(S.RUNNING, attempts=1)),
            tool(S.RUNNING, attempts=1),
            worker="w",
            now=NOW,
            ttl=TTL,
        ),
        Seen(R.RUNNING, S.RUNNING, (("running", "running", 1, "attempt 2"),)),
    ),
    Case(
        "claim-on-a-hint",
        lambda: t.claim_pending("r1", 7, 1, 0, worker="w", now=NOW, ttl=TTL),
        Seen(R.RUNNING, S.RUNNING, (("running", "pending", 1, "attempt 1"),)),
    ),
]

RESULTS = [
    Case(
        "record-a-tool-result",
        lambda: _record(run(), StepOutcome(Happened.DONE, result=1)),
        Seen(R.RUNNING, S.DONE, (("done", "running", 1, None),)),
    ),
    Case(
        "record-straight-through-in-a-pending-run",
        lambda: _record(run(R.PENDING, model()), StepOutcome(Happened.DONE), claimed=False),
        Seen(R.RUNNING, S.DONE, (("running", "pending", None, None), ("done", "pending", 0, None))),
    ),
    Case(
        "record-a-final-answer",
        lambda: _record(run(step=model()), StepOutcome(Happened.FINAL, final="done")),
        Seen(
            R.COMPLETED,
            S.DONE,
            (("done", "running", 0, None), ("completed", "running", None, None)),
        ),
    ),
    Case(
        "record-a-call-in-doubt",
        lambda: _record(run(), StepOutcome(Happened.IN_DOUBT, error="may have sent")),
        Seen(
            R.WAITING,
            S.IN_DOUBT,
            (
                ("in_doubt", "running", 1, "may have sent"),
                ("waiting", "running", None, "may have sent"),
            ),
        ),
    ),
    Case(
        "record-a-replay-that-diverged",
        lambda: _record(run(), StepOutcome(Happened.DIVERGED, error="off the recording")),
        Seen(
            R.DIVERGED,
            S.FAILED,
            (
                ("failed", "running", 1, "off the recording"),
                ("diverged", "running", None, "off the recording"),
            ),
        ),
    ),
    Case(
        "record-a-tool-error-the-model-is-told",
        lambda: _record(run(), StepOutcome(Happened.TOOL_ERROR, error=BOOM)),
        Seen(R.RUNNING, S.FAILED, (("failed", "running", 1, BOOM),)),
    ),
    Case(
        "record-a-tool-error-that-fails-the-run",
        lambda: _record(run(), StepOutcome(Happened.TOOL_ERROR, error=BOOM, note="n"), fail=True),
        Seen(
            R.FAILED,
            S.FAILED,
            (
                ("failed", "running", 1, "n: boom"),
                ("failed", "running", None, "step 1 failed: boom"),
            ),
        ),
    ),
    Case(
        "record-a-rejection-never-fails-the-run",
        lambda: _record(run(), StepOutcome(Happened.REJECTED, error="rejected by bob"), fail=True),
        Seen(R.RUNNING, S.FAILED, (("failed", "running", 1, "rejected by bob"),)),
    ),
    Case(
        "record-a-model-failure",
        lambda: _record(run(step=model()), StepOutcome(Happened.MODEL_FAILED, error=BOOM)),
        Seen(
            R.FAILED, S.FAILED, (("failed", "running", 0, BOOM), ("failed", "running", None, BOOM))
        ),
    ),
    Case(
        "record-an-unstorable-tool-outcome",
        lambda: _record(run(), t.unstorable(StepOutcome(Happened.DONE), tool(), "NUL")),
        Seen(
            R.RUNNING,
            S.FAILED,
            (("failed", "running", 1, "the outcome of step 1 could not be stored: NUL"),),
        ),
    ),
    Case(
        "record-an-unstorable-model-outcome",
        lambda: _record(run(step=model()), t.unstorable(StepOutcome(Happened.DONE), model(), "x")),
        Seen(
            R.FAILED,
            S.FAILED,
            (
                ("failed", "running", 0, "the outcome of step 0 could not be stored: x"),
                ("failed", "running", None, "the outcome of step 0 could not be stored: x"),
            ),
        ),
    ),
]

WAITS = [
    Case(
        "back-off-from-a-busy-key",
        lambda: t.back_off(
            run(),
            tool(),
            version=8,
            worker="w",
            now=NOW,
            retry_after=5,
            reason="busy",
            claimed=True,
        ),
        Seen(None, S.PENDING, (("backed_off", "running", 1, "busy; retry in 5.0s"),)),
    ),
    Case(
        "reschedule-a-retry",
        lambda: t.reschedule(
            run(step=model()),
            model(retries=1),
            t.Reschedule(30.0, "HTTP 429", retry=True),
            version=8,
            worker="w",
            now=NOW,
            claimed=True,
        ),
        Seen(R.RUNNING, S.PENDING, (("retry_scheduled", "running", 0, "HTTP 429; in 30.0s"),)),
    ),
    Case(
        "reschedule-for-a-rate-limit",
        lambda: t.reschedule(
            run(step=model()),
            model(),
            t.Reschedule(2.0, "rate limit", retry=False),
            version=8,
            worker="w",
            now=NOW,
            claimed=False,
        ),
        Seen(R.RUNNING, S.PENDING, (("rate_limited", "pending", 0, "rate limit; in 2.0s"),)),
    ),
    Case(
        "redispatch-a-run-whose-message-was-lost",
        lambda: t.redispatch(run(wake_at=NOW - 5), now=NOW, ttl=TTL),
        Seen(
            None,
            None,
            (
                (
                    "redispatched",
                    None,
                    1,
                    "no step message processed 5.0s after due; re-send 1, next in 30s at most",
                ),
            ),
        ),
    ),
    Case(
        "block-a-run-no-worker-here-can-carry",
        lambda: t.block(run(), "no agent named 'bot'", worker="w", now=NOW),
        Seen(None, None, (("blocked", None, 1, "no agent named 'bot'"),)),
    ),
]

STOPS = [
    Case(
        "fail-over-a-limit",
        lambda: t.fail(run(owner="w-old"), "exceeded max_steps=3", worker="w", now=NOW),
        Seen(
            R.FAILED,
            None,
            (
                ("lease_takeover", None, None, "from w-old"),
                ("failed", "running", None, "exceeded max_steps=3"),
            ),
        ),
    ),
    Case(
        "pause-for-a-budget-spent",
        lambda: t.pause(run(step=model()), "token budget: 90 used", worker="w", now=NOW),
        Seen(R.PAUSED, None, (("paused", "running", 0, "token budget: 90 used"),)),
    ),
    Case(
        "cancel",
        lambda: t.cancel(run(), "not needed", now=NOW),
        Seen(R.CANCELLED, None, (("cancelled", "running", None, "not needed"),)),
    ),
]

APPROVALS = [
    Case(
        "await-approval",
        lambda: t.await_approval(run(), tool(), worker="w", now=NOW),
        Seen(
            R.WAITING,
            S.AWAITING_APPROVAL,
            (
                ("awaiting_approval", "pending", 1, "pay awaits approval"),
                ("waiting", "running", None, "pay awaits approval"),
            ),
        ),
    ),
    Case(
        "approve-with-edited-arguments",
        lambda: t.decide(
            run(R.WAITING, WAITING_STEP),
            WAITING_STEP,
            word(proposed_args={"amount": 5}),
            EDITED,
            now=NOW,
            ttl=TTL,
        ),
        Seen(
            R.RUNNING,
            S.PENDING,
            (
                ("approved", "awaiting_approval", 1, 'by alice; arguments edited to {"amount": 3}'),
                ("running", "waiting", None, None),
            ),
        ),
    ),
    Case(
        "reject-with-a-reason",
        lambda: t.decide(
            run(R.WAITING, WAITING_STEP),
            WAITING_STEP,
            word(Verdict.REJECTED, "bob", reason="too much"),
            None,
            now=NOW,
            ttl=TTL,
        ),
        Seen(
            R.RUNNING,
            S.PENDING,
            (
                ("rejected", "awaiting_approval", 1, "by bob; reason: too much"),
                ("running", "waiting", None, None),
            ),
        ),
    ),
    Case(
        "act-on-a-word-given-ahead",
        lambda: t.act_on_word_ahead(
            run(R.WAITING, replace(WAITING_STEP, approval=word())),
            replace(WAITING_STEP, approval=word()),
            who="w",
            now=NOW,
            ttl=TTL,
        ),
        Seen(
            R.RUNNING,
            S.PENDING,
            (
                ("approved", "awaiting_approval", 1, "acting on the word of alice, given ahead"),
                ("running", "waiting", None, None),
            ),
        ),
    ),
    Case(
        "approve-a-later-call-ahead",
        lambda: t.note_approval(run(), tool(index=2), word(), EDITED, now=NOW),
        Seen(
            None,
            S.PENDING,
            (("approved", "pending", 2, 'by alice; arguments edited to {"amount": 3}'),),
        ),
    ),
    Case(
        "approve-ahead-refused-on-an-ended-run",
        lambda: t.note_approval(run(R.COMPLETED), tool(index=2), word(), None, now=NOW),
        (DecisionConflict, "run r1 has completed; nothing changed"),
    ),
    Case(
        "approve-ahead-refused-on-a-call-with-a-word",
        lambda: t.note_approval(
            run(), tool(index=2, approval=word(Verdict.REJECTED)), word(), None, now=NOW
        ),
        (DecisionConflict, "run r1 is running: step 2 was already rejected; nothing changed"),
    ),
    Case(
        "approve-ahead-refused-on-a-call-under-way",
        lambda: t.note_approval(run(), tool(S.RUNNING, index=2), word(), None, now=NOW),
        (OperatorError, "step 2 of run r1 is running: not a call ahead"),
    ),
]

PAUSES = [
    Case(
        "ask-a-moving-run-to-pause",
        lambda: t.request_pause(run(), who="dave", now=NOW),
        Seen(None, None, (("pause_requested", None, None, "by dave"),)),
    ),
    Case(
        "ask-a-paused-run-to-pause",
        lambda: _pause_refused(run(R.PAUSED)),
        "unchanged: already paused",
    ),
    Case(
        "ask-again-to-pause",
        lambda: _pause_refused(run(pause_requested=True)),
        "unchanged: a pause was already asked for",
    ),
    Case(
        "ask-an-ended-run-to-pause",
        lambda: _pause_refused(run(R.CANCELLED)),
        (DecisionConflict, "run r1 has been cancelled; nothing changed"),
    ),
    Case(
        "withdraw-a-pause-asked-for",
        lambda: t.withdraw_pause(run(pause_requested=True), who="dave", now=NOW),
        Seen(None, None, (("pause_withdrawn", None, None, "by dave"),)),
    ),
    Case(
        "resume-with-a-budget-raised",
        lambda: t.resume(run(R.PAUSED), who="dave", now=NOW, ttl=TTL, max_tokens=100),
        Seen(
            R.RUNNING,
            None,
            (("running", "paused", 1, "resumed by dave; budget set: max_tokens=100"),),
        ),
    ),
]

RESOLUTIONS = [
    Case(
        "resolve-retry",
        lambda: _resolve(Decision.RETRY),
        Seen(
            R.RUNNING,
            S.PENDING,
            (
                ("pending", "in_doubt", 1, "operator: retry"),
                ("running", "waiting", None, "operator: retry"),
            ),
        ),
    ),
    Case(
        "resolve-retry-refused-while-the-call-may-run",
        lambda: _resolve(Decision.RETRY, started_at=NOW - 10),
        (NotResolvable, "step 1 may still be executing .* passes in 20s"),
    ),
    Case(
        "resolve-retry-forced",
        lambda: _resolve(Decision.RETRY, started_at=NOW - 10, force=True),
        Seen(
            R.RUNNING,
            S.PENDING,
            (
                ("pending", "in_doubt", 1, "operator: retry"),
                ("running", "waiting", None, "operator: retry"),
            ),
        ),
    ),
    Case(
        "resolve-succeeded",
        lambda: _resolve(Decision.SUCCEEDED, result="sent"),
        Seen(
            R.RUNNING,
            S.DONE,
            (
                ("done", "in_doubt", 1, "operator: succeeded"),
                ("running", "waiting", None, "operator: succeeded"),
            ),
        ),
    ),
    Case(
        "resolve-adopts-a-stored-result",
        lambda: _resolve(Decision.RETRY, result={"id": 9}, adopted=True, started_at=NOW),
        Seen(
            R.RUNNING,
            S.DONE,
            tuple(
                (
                    to,
                    frm,
                    index,
                    ADOPTED,
                )
                for to, frm, index in (("done", "in_doubt", 1), ("running", "waiting", None))
            ),
        ),
    ),
    Case(
        "resolve-fail-the-model-is-told",
        lambda: _resolve(Decision.FAIL),
        Seen(
            R.RUNNING,
            S.FAILED,
            (
                ("failed", "in_doubt", 1, "operator: fail"),
                ("running", "waiting", None, "operator: fail"),
            ),
        ),
    ),
    Case(
        "resolve-fail-that-fails-the-run",
        lambda: _resolve(Decision.FAIL, fail_run=True),
        Seen(
            R.FAILED,
            S.FAILED,
            (
                ("failed", "in_doubt", 1, "operator: fail"),
                ("failed", "waiting", None, "operator: fail"),
            ),
        ),
    ),
]

PAID = Wait(WaitKind.SIGNAL, NOW + 60, 60.0, signal="paid")
NAP = Wait(WaitKind.SLEEP, NOW + 600, 600.0)
CHILD = Wait(WaitKind.CHILD, None, None, child="r1:1")
UNTIL = "1970-01-01T00:17:40Z"  # NOW + 60


def deferred(wait: Wait = PAID, index: int = 1) -> Step:
    return tool(S.DEFERRED, index=index, attempts=1, wait=wait)


def child_run(status: RunStatus, **kw: Any) -> Run:
    fields: dict[str, Any] = {"input_tokens": 10, "output_tokens": 4, "cost_usd": 0.5} | kw
    return Run("r1:1", "researcher", "find x", status, 1, 5, 2, **fields)


DEFERRALS = [
    Case(
        "record-a-deferred-call",
        lambda: _record(run(), StepOutcome(Happened.DEFERRED, result={"w": 1}, wait=PAID)),
        Seen(R.RUNNING, S.DEFERRED, (("deferred", "running", 1, None),)),
    ),
    Case(
        "await-deferred-at-the-next-model-turn",
        lambda: t.await_deferred(
            run(step=model(index=3), deferred_from=1),
            [deferred()],
            worker="w",
            now=NOW,
            ttl=TTL,
        ),
        Seen(
            R.WAITING,
            None,
            (("waiting", "running", None, f"waits for step 1 (signal 'paid', until {UNTIL})"),),
        ),
    ),
    Case(
        "still-waiting-when-the-sweeper-looks",
        lambda: t.still_waiting(
            run(R.WAITING, model(index=3), deferred_from=1),
            [deferred(CHILD)],
            worker="sweeper",
            now=NOW,
            ttl=TTL,
        ),
        Seen(None, None, ()),
    ),
    Case(
        "resume-waiting-when-every-answer-is-in",
        lambda: t.resume_waiting(
            run(R.WAITING, model(index=3), deferred_from=1), worker="w", now=NOW, ttl=TTL
        ),
        Seen(
            R.RUNNING, None, (("running", "waiting", None, "every deferred call has its answer"),)
        ),
    ),
    Case(
        "answer-a-deferred-call",
        lambda: t.answer(deferred(), result={"amount": 5}, by="signal 'paid'", worker="w", now=NOW),
        Seen(None, S.DONE, (("done", "deferred", 1, "signal 'paid'"),)),
    ),
    Case(
        "answer-a-deferred-call-with-an-error",
        lambda: t.answer(deferred(), error="declined", by="completed by bob", worker="w", now=NOW),
        Seen(None, S.FAILED, (("failed", "deferred", 1, "completed by bob"),)),
    ),
    Case(
        "time-out-a-deferred-call",
        lambda: t.time_out(deferred(), worker="sweeper", now=NOW + 60),
        Seen(
            None,
            S.FAILED,
            (
                (
                    "failed",
                    "deferred",
                    1,
                    "timed out: no answer within 60 s (waited for signal 'paid')",
                ),
            ),
        ),
    ),
    Case(
        "time-out-a-sleep-is-its-wake-up",
        lambda: t.time_out(deferred(NAP), worker="sweeper", now=NOW + 600),
        Seen(None, S.DONE, (("done", "deferred", 1, "woke: its sleep ended"),)),
    ),
    Case(
        "child-answer-of-a-completed-child",
        lambda: t.child_answer(
            deferred(CHILD), child_run(R.COMPLETED, result="42"), worker="w", now=NOW
        ),
        Seen(None, S.DONE, (("done", "deferred", 1, "child run r1:1 completed"),)),
    ),
    Case(
        "child-answer-of-a-failed-child",
        lambda: t.child_answer(
            deferred(CHILD), child_run(R.FAILED, error="no budget"), worker="w", now=NOW
        ),
        Seen(None, S.FAILED, (("failed", "deferred", 1, "child run r1:1 failed"),)),
    ),
    Case(
        "child-answer-of-a-cancelled-child",
        lambda: t.child_answer(deferred(CHILD), child_run(R.CANCELLED), worker="w", now=NOW),
        Seen(None, S.FAILED, (("failed", "deferred", 1, "child run r1:1 cancelled"),)),
    ),
]

CASES = CREATION + CLAIMS + RESULTS + WAITS + STOPS + APPROVALS + PAUSES + RESOLUTIONS + DEFERRALS


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_transition(case: Case) -> None:
    if isinstance(case.want, tuple) and isinstance(case.want[0], type):
        error, message = case.want
        with pytest.raises(error, match=message):
            case.make()
        return
    assert seen(case.make()) == case.want


SETTLED = [
    (Happened.DONE, False, R.RUNNING, S.DONE),
    (Happened.FINAL, False, R.COMPLETED, S.DONE),
    (Happened.TOOL_ERROR, False, R.RUNNING, S.FAILED),
    (Happened.TOOL_ERROR, True, R.FAILED, S.FAILED),
    (Happened.REJECTED, True, R.RUNNING, S.FAILED),
    (Happened.IN_DOUBT, True, R.WAITING, S.IN_DOUBT),
    (Happened.DIVERGED, False, R.DIVERGED, S.FAILED),
    (Happened.MODEL_FAILED, False, R.FAILED, S.FAILED),
    (Happened.UNSTORABLE, False, R.RUNNING, S.FAILED),
    (Happened.UNSTORABLE, True, R.FAILED, S.FAILED),
    (Happened.DEFERRED, True, R.RUNNING, S.DEFERRED),
]


@pytest.mark.parametrize(
    ("happened", "fail_on_tool_error", "run_status", "step_status"),
    SETTLED,
    ids=[f"{h}-{'fail' if f else 'tell'}" for h, f, _, _ in SETTLED],
)
def test_what_an_outcome_of_a_tool_call_makes_of_its_step_and_run(
    happened: Happened, fail_on_tool_error: bool, run_status: RunStatus, step_status: StepStatus
) -> None:
    outcome = StepOutcome(happened, error=BOOM)
    settled = t.settle(tool(), outcome, fail_on_tool_error=fail_on_tool_error)
    assert (settled.status, outcome.status) == (run_status, step_status)


def test_every_outcome_is_in_the_table() -> None:
    assert {h for h, *_ in SETTLED} == set(Happened)


def test_a_final_answer_and_what_a_turn_cost_reach_the_run_row() -> None:
    outcome = StepOutcome(
        Happened.FINAL, final="42", usage=Usage(input_tokens=10, output_tokens=5), cost_usd=0.5
    )
    checkpoint = _record(run(step=model(), input_tokens=1, cost_usd=0.25), outcome)
    values = checkpoint.run.values()
    assert (values["result"], values["input_tokens"], values["output_tokens"]) == ("42", 11, 5)
    assert (values["cost_usd"], values["cursor"], values["owner"]) == (0.75, 1, None)


def test_an_in_doubt_step_keeps_the_cursor_and_any_other_moves_past_it() -> None:
    assert _record(run(), StepOutcome(Happened.IN_DOUBT)).run.cursor == 1
    assert _record(run(), StepOutcome(Happened.TOOL_ERROR)).run.cursor == 2


def test_a_pause_note_names_the_states_it_applies_in() -> None:
    note = t.request_pause(run(), who="dave", now=NOW)
    assert isinstance(note, PauseNote)
    assert (note.requested, note.while_status, note.worker) == (True, t.PAUSABLE, "dave")
    assert not any(status.terminal for status in t.PAUSABLE) and R.PAUSED not in t.PAUSABLE


def test_an_approval_is_stored_as_the_same_json() -> None:
    """The word keeps the shape migration 0006 stored, and any other it finds."""
    made = {"decision": "approved", "by": "alice", "at": 1.5, "proposed_args": {"a": 1}}
    assert Approval.from_json(made) == word(by="alice", proposed_args={"a": 1}, at=1.5)
    assert Approval.from_json(made).to_json() == made
    for other in ({}, {"by": 7, "at": "noon"}, {"decision": "maybe", "x": 1}, [1], "no"):
        assert Approval.from_json(other).to_json() == other
    kept = Approval.from_json({"decision": "rejected", "by": "b", "at": 2, "reason": None})
    assert kept.rejected and kept.to_json()["reason"] is None


def test_a_replay_records_where_it_comes_from() -> None:
    new, _ = t.replay(run(R.FAILED), run_id="r2", agent="bot", live_read_only=False, now=NOW)
    assert new.replay_of == ReplayOrigin("r1", False)
    assert t.created(new).detail == "agent=bot; replay of r1"


def test_a_deferred_call_records_its_wait_and_where_the_next_turn_looks() -> None:
    outcome = StepOutcome(Happened.DEFERRED, result={"__harness_wait__": {}}, wait=PAID)
    first = _record(run(), outcome)
    (step,) = first.steps
    assert (step.wait, step.result, step.finished_at) == (PAID, None, None)
    assert first.run.deferred_from == 1 and first.run.cursor == 2
    # a later call of the same turn defers too: the first one is still where to look
    later = _record(run(step=tool(index=2), cursor=2, deferred_from=1), outcome)
    assert later.run.deferred_from is KEEP
    # a call that settles leaves the mark as it is
    plain = _record(run(step=tool(index=2), deferred_from=1), StepOutcome(Happened.DONE))
    assert plain.run.deferred_from is KEEP and plain.steps[0].wait is KEEP


def test_a_model_turn_clears_the_mark_its_gate_looked_at() -> None:
    loaded = run(step=model(index=3), deferred_from=1)
    turn = StepOutcome(Happened.DONE, result={"tool_calls": []})
    assert _record(loaded, turn).run.deferred_from is None
    assert _record(run(step=model(index=3)), turn).run.deferred_from is KEEP


def test_waiting_wakes_at_the_first_timeout_and_resuming_clears_the_mark() -> None:
    waiting = [deferred(NAP, 1), deferred(PAID, 2)]
    held = t.await_deferred(run(step=model(index=3)), waiting, worker="w", now=NOW, ttl=TTL)
    values = held.run.values()
    # Looked at one TTL in (the worker may die before it looks for an answer), then at 60 s.
    assert (values["wake_at"], values["owner"], values["resends"]) == (NOW + TTL, None, 0)
    later = t.still_waiting(run(R.WAITING), waiting, worker="sweeper", now=NOW, ttl=TTL)
    assert later.run.wake_at == NOW + 60
    back = t.resume_waiting(run(R.WAITING, deferred_from=1), worker="w", now=NOW, ttl=TTL)
    assert (back.run.deferred_from, back.run.wake_at, back.run.owner) == (None, NOW + TTL, None)


def test_a_wait_on_a_child_is_looked_at_spaced_out_like_resends() -> None:
    on_child = [deferred(CHILD)]
    assert t.wake_time(on_child, now=NOW, ttl=TTL, checks=0) == NOW + TTL
    assert t.wake_time(on_child, now=NOW, ttl=TTL, checks=3) == NOW + 8 * TTL
    capped = NOW + TTL * 2**t.MAX_RESEND_DOUBLINGS
    assert t.wake_time(on_child, now=NOW, ttl=TTL, checks=99) == capped
    assert t.wake_time([*on_child, deferred(PAID, 2)], now=NOW, ttl=TTL, checks=3) == NOW + 60
    callback = [deferred(Wait(WaitKind.CALLBACK), 2)]  # no timeout: one look, then its answer
    assert t.wake_time(callback, now=NOW, ttl=TTL, checks=0) == NOW + TTL
    assert t.wake_time(callback, now=NOW, ttl=TTL, checks=1) == NOW + MAX_WAIT
    again = t.still_waiting(run(R.WAITING, resends=2), on_child, worker="sweeper", now=NOW, ttl=TTL)
    assert (again.run.wake_at, again.run.resends) == (NOW + 8 * TTL, 3)


def test_answers_carry_what_the_model_sees_and_a_childs_usage() -> None:
    slept = t.time_out(deferred(NAP), worker="w", now=NOW)
    assert (slept.result, slept.error, slept.run_id, slept.index) == ({"slept": 600}, None, "r1", 1)
    late = t.time_out(deferred(), worker="w", now=NOW)
    assert late.result is None
    assert late.error == "no answer within 60 s (waited for signal 'paid')"
    erred = t.answer(deferred(), result={"x": 1}, error="no", by="b", worker="w", now=NOW)
    assert (erred.result, erred.error) == (None, "no")
    done = t.child_answer(deferred(CHILD), child_run(R.COMPLETED, result="42"), worker="w", now=NOW)
    assert (done.result, done.usage) == ("42", (10, 4, 0.5))
    failed = t.child_answer(
        deferred(CHILD), child_run(R.FAILED, error="no budget"), worker="w", now=NOW
    )
    assert (failed.error, failed.usage) == ("child run r1:1 failed: no budget", (10, 4, 0.5))
