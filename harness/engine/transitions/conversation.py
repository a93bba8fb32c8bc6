"""The transitions of a conversation: the user's messages made steps.

A message is a step of kind ``user`` holding its text, done as it is
written; the model turn after it sees it as the user's turn. Messages kept
for a run (``harness send`` while it moves) are taken by the transition
that makes them steps, in the same checkpoint (``take_signals``), so each
becomes one step, once, in the order it was kept:

- :func:`continue_run`: a completed run goes on, the messages and a new
  model turn appended after its last step;
- :func:`take_messages`: at a model turn of a moving run, the messages come
  first: the pending model step becomes the first message's step, the
  others and the model turn follow it;
- :func:`steered`: the model's final answer, while messages wait, is a turn
  like any other: the messages and the next model turn follow it, and the
  run goes on instead of completing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from harness.engine.transitions.execution import USER_SAID, Happened, StepOutcome
from harness.engine.transitions.owners import takeover
from harness.records import JSON, Run, RunStatus, Step, StepKind, StepStatus
from harness.store import Checkpoint, EventDraft, KeptSignal, RunPatch, StepPatch

#: The event detail of a user's message made a step.
SAID = USER_SAID


def text_of(message: KeptSignal) -> str:
    """A kept message's text (as ``harness send`` keeps it: ``{"text": ...}``)."""
    data = message.data
    text = data.get("text") if isinstance(data, dict) else None
    return text if isinstance(text, str) else ""


def turns(
    run_id: str,
    first: int,
    messages: Sequence[KeptSignal],
    next_turn: int,
    now: float,
    carried: Mapping[str, JSON] | None = None,
) -> tuple[list[Step], tuple[tuple[int, int], ...]]:
    """The messages as ``user`` steps from index ``first``, then the model
    step of turn ``next_turn``; and which message each step takes."""
    steps = [
        Step(
            run_id,
            first + i,
            StepKind.USER,
            StepStatus.DONE,
            attempts=1,
            args={"text": text_of(m)},
            started_at=now,
            finished_at=now,
        )
        for i, m in enumerate(messages)
    ]
    model = first + len(steps)
    args = {**(carried or {}), "turn": next_turn}
    steps.append(Step(run_id, model, StepKind.MODEL, StepStatus.PENDING, args=args))
    takes = tuple((m.id, first + i) for i, m in enumerate(messages))
    return steps, takes


def said(steps: Sequence[Step]) -> tuple[EventDraft, ...]:
    """The event of each user's message among ``steps``, made a step."""
    return tuple(
        EventDraft(StepStatus.DONE, None, s.index, SAID) for s in steps if s.kind is StepKind.USER
    )


def continue_run(
    run: Run,
    messages: Sequence[KeptSignal],
    next_turn: int,
    *,
    worker: str,
    now: float,
    ttl: float,
) -> Checkpoint:
    """A completed run goes on with the user's ``messages``: they and the
    model turn ``next_turn`` are appended, and the run moves again, its
    result the next final answer's."""
    steps, takes = turns(run.run_id, run.step_count, messages, next_turn, now)
    detail = f"continued: {len(messages)} message(s) from the user"
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            cursor=steps[-1].index,
            step_count=run.step_count + len(steps),
            owner=None,
            lease_expires_at=None,
            wake_at=now + ttl,
            result=None,
            error=None,
            resends=0,
            blocked=None,
        ),
        new_steps=tuple(steps),
        events=(EventDraft(RunStatus.RUNNING, run.status, detail=detail), *said(steps)),
        take_signals=takes,
    )


def take_messages(
    run: Run, step: Step, messages: Sequence[KeptSignal], *, worker: str, now: float, ttl: float
) -> Checkpoint:
    """At model step ``step`` (pending, at the cursor), the user's messages
    come first: ``step`` becomes the first message's step, the others follow,
    then the model turn ``step`` was to be."""
    first = messages[0]
    turn = int(step.args.get("turn", 0))
    # The turn keeps what its step carried (the invalid answers so far): a
    # message is not a valid answer, and does not reset the count.
    steps, takes = turns(run.run_id, step.index, messages, turn, now, step.args)
    patch = StepPatch(
        step.index,
        kind=StepKind.USER,
        status=StepStatus.DONE,
        attempts=1,
        args={"text": text_of(first)},
        error=None,
        retries=0,
        started_at=now,
        finished_at=now,
    )
    appended = tuple(steps[1:])
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch(
            cursor=steps[-1].index,
            step_count=run.step_count + len(appended),
            # Unleased and unmarked (a reschedule's mark would drop the turn's
            # message as early): the next step's message may reach any worker.
            owner=None,
            lease_expires_at=None,
            wake_at=now + ttl,
            resends=0,
        ),
        steps=(patch,),
        new_steps=appended,
        events=(*takeover(run), *said(steps)),
        take_signals=takes,
    )


def steered(
    outcome: StepOutcome, step: Step, messages: Sequence[KeptSignal], now: float
) -> StepOutcome:
    """The model answered finally while ``messages`` wait: a turn like one
    that called tools, the messages and the next model turn its new steps,
    so the run goes on (the answer stays on the step, for the transcript)."""
    turn = int(step.args.get("turn", 0))
    steps, takes = turns(step.run_id, step.index + 1, messages, turn + 1, now)
    return replace(
        outcome,
        happened=Happened.DONE,
        final=None,
        new_steps=tuple(steps),
        takes=takes,
        note="steered: the user's message came before the answer ended the run",
    )
