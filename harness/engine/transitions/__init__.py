"""Every transition of a run, in one place.

Each function here is pure: it turns the run as loaded (and what happened to
it) into what records the transition: the :class:`~harness.store.Checkpoint`
to write, a note to write beside the version, or a new run with its creation
event. It decides the run's and the step's next status, the events and their
text; it refuses (raises) what does not apply to the run as it is. The
runner, the sweeper and the operator actions decide *when* a transition
happens and handle its failure; step code says what happened (a
:class:`StepOutcome`), and nowhere else builds a checkpoint or words an
event. The whole state machine::

    run   (none) ──new_run / fork / replay──> pending (its creation event: created)
          pending ──claim / record──> running ──record(final)──────────> completed
                                        │ ├──record(in doubt)──> waiting ──resolve──> running
                                        │ ├──record(model failure; a tool error
                                        │ │   with on_tool_error="fail")──> failed
                                        │ ├──record(a replay's call off its recording)──> diverged
                                        │ └──fail (a limit, a budget spent)──> failed
          running ──await_approval──> waiting ──decide (approve/reject)──> running
                                              └──act_on_word_ahead──> running
          running ──await_deferred (a model turn with calls of the turn before
                    still deferred)──> waiting ──resume_waiting (every answer in)──> running
                    waiting ──still_waiting (the sweeper looked: its next look)──> waiting
          pending|running|waiting ──request_pause (a note beside the version)──> the same,
                                  asked to pause ──pause (at its next boundary)──> paused
          paused ──resume──> running           asked to pause ──withdraw_pause──> not asked
          running ──pause (a budget spent with on_budget="pause")──> paused
          any run not ended ──cancel──> cancelled

    step  pending ──claim (or claim_pending, on a message's hint)──> running
          running ──record──> done | failed | in_doubt          (as settle says)
          pending ──record (straight through, no RUNNING write)──> done | failed | in_doubt
          running ──back_off──> what it was before the claim (not an attempt, not a crash)
          running ──reschedule──> pending, woken later (a provider's transient
                                  failure, counted in ``retries``; or a rate limit)
          in_doubt ──resolve──> pending (retry) | done (succeeded) | failed
          pending ──await_approval──> awaiting_approval ──decide──> pending, with the word
          pending ──note_approval (a later call of the batch, beside the version)──>
                                  pending, with the word; acted on when reached
          pending|running ──record (deferred: harness.Deferred, a Sleep, a child)──> deferred
          deferred ──answer | time_out | child_answer (a Completion, beside the
                     version; the first wins)──> done | failed

Refusals: an operator's action on a run that has gone against it raises
:func:`conflict`'s :class:`~harness.errors.DecisionConflict`; one that finds
the run already as asked returns :class:`Unchanged`. The modules: ``owners``
(the marks in a run's owner column), ``execution`` (the step lifecycle, what
a worker writes), ``resends`` (what the sweeper writes), ``operator`` (an operator's actions and
notes), ``creation`` (new runs), ``waits`` (deferred calls' answers, timeouts
and sleeps, a run waiting on them; ``wake_time`` says when the sweeper looks).
"""

from harness.engine.transitions.creation import Fork, created, fork, new_run, replay
from harness.engine.transitions.execution import (
    Happened,
    Reschedule,
    Settled,
    StepOutcome,
    await_approval,
    back_off,
    claim,
    claim_pending,
    fail,
    pause,
    record,
    renew,
    reschedule,
    settle,
    unstorable,
)
from harness.engine.transitions.operator import (
    PAUSABLE,
    RESOLVED_TO,
    Decision,
    Unchanged,
    act_on_word_ahead,
    approval_detail,
    cancel,
    conflict,
    decide,
    note_approval,
    request_pause,
    resolve,
    resume,
    withdraw_pause,
)
from harness.engine.transitions.owners import (
    BACKED_OFF,
    LAPSED,
    MARKS,
    OPERATOR,
    RESCHEDULED,
    SWEEPER,
    takeover,
)
from harness.engine.transitions.resends import (
    MAX_RESEND_DOUBLINGS,
    block,
    redispatch,
    resend_delay,
)
from harness.engine.transitions.waits import (
    answer,
    await_deferred,
    child_answer,
    resume_waiting,
    still_waiting,
    time_out,
    wake_time,
)

__all__ = [
    "BACKED_OFF",
    "LAPSED",
    "MARKS",
    "MAX_RESEND_DOUBLINGS",
    "OPERATOR",
    "PAUSABLE",
    "RESCHEDULED",
    "RESOLVED_TO",
    "SWEEPER",
    "Decision",
    "Fork",
    "Happened",
    "Reschedule",
    "Settled",
    "StepOutcome",
    "Unchanged",
    "act_on_word_ahead",
    "answer",
    "approval_detail",
    "await_approval",
    "await_deferred",
    "back_off",
    "block",
    "cancel",
    "child_answer",
    "claim",
    "claim_pending",
    "conflict",
    "created",
    "decide",
    "fail",
    "fork",
    "new_run",
    "note_approval",
    "pause",
    "record",
    "redispatch",
    "renew",
    "replay",
    "request_pause",
    "reschedule",
    "resend_delay",
    "resolve",
    "resume",
    "resume_waiting",
    "settle",
    "still_waiting",
    "takeover",
    "time_out",
    "unstorable",
    "wake_time",
    "withdraw_pause",
]
