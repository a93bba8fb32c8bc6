"""Conversations: a user's next message to a run, kept and made a step once.

``harness send`` (:func:`send_message`) keeps the message
(``Store.keep_message``, which marks the run's inbox beside its version),
then:

- a completed run goes on at once (:func:`continue_completed`: the kept
  messages and a new model turn appended, by compare-and-swap);
- a moving run gets it at its next model turn (:func:`at_model_turn`, from
  the runner, when the loaded run's inbox is marked), or, if the model is
  answering finally meanwhile, the answer is steered (:func:`steer`): the
  run goes on instead of completing;
- a failed, cancelled or diverged run refuses it, and so does a run whose
  agent takes no messages (a Pydantic AI agent's); where its agent is not
  registered the message is kept, and its workers leave it untaken.

Each taking transition takes the kept rows in its own checkpoint, so a
message becomes one step, once, in order, whoever races. The sender looks
at the run after keeping its message, and the runner looks for messages
after it completes a run (:func:`after_completed`): of the two, at least one
sees the other, so no message is left behind a completed run.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from harness.agents import get_agent
from harness.engine.runtime import Runtime, commit, dispatch
from harness.engine.transitions import Happened, StepOutcome, conflict
from harness.engine.transitions import conversation as transitions
from harness.errors import AgentNotFound, StaleWriteError, StoreError
from harness.records import JSON, Run, RunStatus, Step, StepKind
from harness.store import MESSAGE, KeptSignal
from harness.streams import Tap

log = logging.getLogger(__name__)

#: How many times a sender looks again when the run moved as it continued it.
TRIES = 5


@dataclass(frozen=True)
class Sent:
    """What a message did: ``continued`` (a completed run goes on with it) or
    ``kept`` (the run's next model turn takes it)."""

    run_id: str
    outcome: str
    said: str

    def to_dict(self) -> dict[str, JSON]:
        return {"run_id": self.run_id, "outcome": self.outcome, "said": self.said}


def waiting_messages(rt: Runtime, run_id: str) -> list[KeptSignal]:
    """The user's messages kept for the run, oldest first."""
    return [s for s in rt.store.kept_signals(run_id) if s.name == MESSAGE]


def send_message(rt: Runtime, run_id: str, text: str, message_id: str | None = None) -> Sent:
    """Give the run the user's next message (see the module docstring).
    ``message_id``: a sender's retry with the same id is received once."""
    run = rt.store.load(run_id)
    if run.status.terminal and run.status is not RunStatus.COMPLETED:
        raise conflict(run, "a message continues only a run that completed or is moving")
    if run.replay_of is not None:
        raise conflict(run, "a replay follows its recording, and takes no message")
    if not _takes_messages(run):
        raise conflict(run, "its agent (a Pydantic AI agent) takes no messages")
    limit = _full(run)
    if run.status is RunStatus.COMPLETED and limit is not None:
        raise conflict(run, f"it has reached its step limit (max_steps={limit})")
    if rt.store.keep_message(run_id, text, rt.clock.now(), message_id) is None:
        return Sent(run_id, "already", f"message {message_id!r} was received already")
    if continue_completed(rt, run_id):
        return Sent(run_id, "continued", "the run goes on with the message")
    run = rt.store.load(run_id)
    if run.status.terminal and run.status is not RunStatus.COMPLETED:
        raise conflict(run, "it ended before the message was taken")
    return Sent(run_id, "kept", "kept for the run's next model turn (or taken by it already)")


def continue_completed(rt: Runtime, run_id: str) -> bool:
    """If the run has completed and messages wait for it, it goes on with
    them: True if this call moved it on (False: it had not completed, or
    another sender or the runner moved it on first, taking the messages
    kept by then)."""
    for _ in range(TRIES):
        run = rt.store.load(run_id)
        if run.status is not RunStatus.COMPLETED or not _takes_messages(run):
            return False
        messages = waiting_messages(rt, run_id)
        if not messages:
            return False
        checkpoint = transitions.continue_run(
            run,
            messages,
            _next_turn(rt, run),
            worker=rt.worker_id,
            now=rt.clock.now(),
            ttl=rt.lease_ttl,
        )
        try:
            commit(rt, checkpoint)
        except StaleWriteError:
            continue  # another sender (or the runner) moved it first: look again
        cursor = checkpoint.run.cursor
        assert isinstance(cursor, int)
        dispatch(rt, run_id, cursor)
        with contextlib.suppress(StoreError):  # a marked inbox costs the next turn a read
            rt.store.clear_inbox(run_id)
        return True
    return False


def _takes_messages(run: Run) -> bool:
    """False if the run's agent refuses messages (its model's
    ``takes_messages`` is False); True where its code is not registered."""
    try:
        agent = get_agent(run.agent)
    except AgentNotFound:
        return True
    return bool(getattr(agent.model, "takes_messages", True))


def _full(run: Run) -> int | None:
    """The step limit of a completed run that a message would make fail (its
    next turn past the limit, and an agent that fails there rather than
    pausing for `harness resume --max-steps`); None if it may go on, or this
    process has not the agent's code (the worker's gate decides then)."""
    try:
        agent = get_agent(run.agent)
    except AgentNotFound:
        return None
    limit = run.max_steps if run.max_steps is not None else agent.max_steps
    if run.step_count + 1 < limit or agent.on_budget == "pause":
        return None
    return limit


#: How many of a completed run's last steps its last model turn is looked for in.
TAIL = 8


def _next_turn(rt: Runtime, run: Run) -> int:
    """The number of the model turn after the run's last one. A completed run
    ends with the model's answer, so its last steps are read, not its whole
    conversation (800 rows by turn 200, bench.conversation); all of it only
    if none of those is a model step."""
    last = _last_turn(rt.store.steps(run.run_id, max(0, run.step_count - TAIL)))
    if last is None and run.step_count > TAIL:
        last = _last_turn(rt.store.steps(run.run_id))
    return 0 if last is None else last + 1


def _last_turn(steps: list[Step]) -> int | None:
    for step in reversed(steps):
        if step.kind is StepKind.MODEL:
            return int(step.args.get("turn", 0))
    return None


#: :func:`at_model_turn`'s answer when another writer moved the run first.
RACED = -1


def at_model_turn(rt: Runtime, run: Run, step: Step) -> int | None:
    """At model step ``step`` of a run whose inbox is marked: the waiting
    messages become steps before it; the index of the model turn that
    follows them, to carry the run on to. None: no message waited (the
    inbox is unmarked); :data:`RACED`: another writer moved the run first."""
    messages = waiting_messages(rt, run.run_id) if _takes_messages(run) else []
    if not messages:  # none, or its agent takes none (kept by a process without it)
        rt.store.clear_inbox(run.run_id)
        return None
    checkpoint = transitions.take_messages(
        run, step, messages, worker=rt.worker_id, now=rt.clock.now(), ttl=rt.lease_ttl
    )
    # Said before the commit, so a crash between cannot leave it unsaid; if the
    # take loses its race the step's next call discards the same attempts anyway.
    _discard_calls(rt, run, step)
    try:
        commit(rt, checkpoint)
    except StaleWriteError:
        return RACED
    cursor = checkpoint.run.cursor
    assert isinstance(cursor, int)
    return cursor


def _discard_calls(rt: Runtime, run: Run, step: Step) -> None:
    """The turn's calls so far will never be recorded: retried, one may have
    written part of an answer before it failed, and its step is now the
    user's message, the turn a step of its own whose calls count from 1 (no
    tap of it discards them). Said in the run's stream, before the turn is
    dispatched, as the step's next call would have said it (harness.streams)."""
    tried = step.attempts + step.retries
    if rt.streams is not None and tried:
        Tap(rt.streams, run.run_id, run.lineage, step.index, tried + 1).close()


def steer(rt: Runtime, run: Run, step: Step, outcome: StepOutcome) -> StepOutcome:
    """The model's final answer, unless a message waits: then the answer is a
    turn like any other and the messages and the next model turn follow it."""
    if outcome.happened is not Happened.FINAL or run.replay_of is not None:
        return outcome
    if not _takes_messages(run):
        return outcome
    messages = waiting_messages(rt, run.run_id)
    if not messages:
        return outcome
    return transitions.steered(outcome, step, messages, rt.clock.now())


def after_completed(rt: Runtime, run_id: str) -> None:
    """The runner completed ``run_id``: a message kept as it did (which the
    sender saw the run still moving for) continues it now. Never raises."""
    try:
        if waiting_messages(rt, run_id):  # one read; most runs end with none
            continue_completed(rt, run_id)
    except Exception as err:
        log.warning("run=%s messages kept as it completed not taken now: %s", run_id, err)
