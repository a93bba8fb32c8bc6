"""What an imported run may be: the checks an export document passes once its
fields have their types (harness.runs.archive), before any row is written.

A document's content hash proves nothing about what it says: anyone who
edits one can recompute it. So every document is read here as if a stranger
wrote it, and refused (:class:`~harness.errors.BadArchive`, one line naming
the field) unless the run it holds is one this store and its workers can
carry:

* **values a column can hold** (:func:`check_nesting`, :func:`check_values`):
  no value nested deeper than :data:`harness.inputs.MAX_DEPTH` (walked
  without recursion, so a document nested too deep for Python is refused,
  not a crash); text as :func:`harness.inputs.checked_text` takes it (no NUL,
  no lone surrogate); JSON as :func:`harness.inputs.checked_json` does (no
  NaN, no integer of more than 1,000 digits). The models bound every integer
  to what PostgreSQL's ``integer`` holds (:data:`MAX_INT`) and every time to
  0 .. :data:`MAX_TIME`;
* **one run, whole** (:func:`check_consistent`): its steps 0..N-1, no row of
  another run, records of its own steps;
* **a state the engine can reach** (:func:`check_state`), so the run neither
  sticks nor loops once imported: what may be at the cursor depends on the
  run's status, the steps after the cursor have not run, the steps from the
  cursor on are a batch of calls and the model turn that reads them, and a
  run that is to go on has room to count. Deferred calls (migration 0014)
  are tool calls before the cursor, each with a wait as
  :class:`harness.records.Wait` stores it, all from ``deferred_from`` on, a
  call of the turn the cursor is in; a waiting run may stand at the pending
  model turn that waits for them;
* **an operator's word only where it was acted on** (:func:`check_approvals`,
  :func:`carried_approval`): an approval is the decision of an operator of
  the exporting deployment. Kept where the step's status shows the call was
  decided: made (done), failed or refused (failed), made and in doubt, made
  and waiting for its answer (deferred), taken up by a worker (running). On
  a call not made yet (pending, or awaiting approval with a word noted
  ahead) it is dropped on import: the run stops at the call and an operator
  of this deployment decides. A call approved and running in a run not
  finished is refused: it may be under way there, and neither making it
  here on that word nor asking again as if it had not been made would be
  true.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import BadArchive, BadInput
from harness.inputs import MAX_DEPTH, MAX_GOAL, checked_json, checked_text
from harness.records import JSON, RunStatus, StepKind, StepStatus, Wait, WaitKind
from harness.runs.document import MAX_INT, MAX_TIME, Document, StepDoc
from harness.store import MESSAGE, schema
from harness.waiting import signal_name

#: A run that is to go on needs this much room below :data:`MAX_INT` in every
#: counter its next writes raise (its version, attempts, tokens).
ROOM = 2**24
#: Validation errors named in the one-line message before "and N more".
_SHOWN_ERRORS = 3
#: The document's sections that hold rows, each row an object of columns.
_ROW_SECTIONS = ("steps", "events", "tool_records", "signals")
_TABLES = {
    "run": schema.runs.name,
    "steps": schema.steps.name,
    "events": schema.events.name,
    "tool_records": schema.tool_results.name,
    "signals": schema.signals.name,
}
_TEXT_LIMITS = {"goal": MAX_GOAL}


def describe(err: ValidationError, prefix: str = "") -> str:
    """A pydantic error as one line: the first few fields at fault and why."""
    errors = err.errors(include_url=False)
    parts = [
        f"{'.'.join([prefix, *(str(p) for p in e['loc'])]).strip('.') or 'document'}: {e['msg']}"
        for e in errors[:_SHOWN_ERRORS]
    ]
    more = len(errors) - _SHOWN_ERRORS
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


# -- values ----------------------------------------------------------------------


def check_nesting(raw: Mapping[str, Any]) -> None:
    """No field's value nested deeper than MAX_DEPTH, so that the hash and
    every check after it can read the document."""
    for name, value in _fields(raw):
        if _deeper_than(value, MAX_DEPTH):
            raise BadArchive(f"invalid document: {name}: nested deeper than {MAX_DEPTH} levels")


def _fields(raw: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every field of the parsed document with its dotted name (``steps.2.result``)."""
    for section, value in raw.items():
        if section in _ROW_SECTIONS and isinstance(value, list):
            for i, row in enumerate(value):
                columns = row.items() if isinstance(row, dict) else [("", row)]
                yield from ((f"{section}.{i}.{c}".rstrip("."), v) for c, v in columns)
        elif isinstance(value, dict):
            yield from ((f"{section}.{c}", v) for c, v in value.items())
        else:
            yield str(section), value


def _deeper_than(value: Any, limit: int) -> bool:
    """Are lists and objects nested more than ``limit`` deep in ``value``? Iterative."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_values(document: Document) -> None:
    """Every text a column can hold unchanged, every JSON value one the
    store and its readers can (harness.inputs)."""
    manifest = document.manifest
    rows: list[tuple[str, str, BaseModel]] = [("run", "run", document.run)]
    for section in _ROW_SECTIONS:
        rows += [(section, f"{section}.{i}", r) for i, r in enumerate(getattr(document, section))]
    try:
        checked_text(manifest.exported_at, "manifest.exported_at")
        checked_text(manifest.harness_version, "manifest.harness_version")
        for section, prefix, row in rows:
            json_columns = schema.JSON_COLUMNS.get(_TABLES[section], ())
            for column in type(row).model_fields:
                value, name = getattr(row, column), f"{prefix}.{column}"
                if column in json_columns:
                    checked_json(value, name)
                elif isinstance(value, str):
                    checked_text(value, name, _TEXT_LIMITS.get(column, sys.maxsize))
    except BadInput as err:
        raise BadArchive(f"invalid document: {err}") from None


# -- the run ---------------------------------------------------------------------

#: The name under which a step's own answer that came before it deferred is kept.
_EARLY_ANSWER = re.compile(r"@step:[0-9]{1,10}")


def check_consistent(document: Document) -> None:
    """One run, whole: its steps 0..N-1, rows of no other run, records of its steps."""
    run, n = document.run, len(document.steps)
    owners = [(f"step {s.idx}", s.run_id) for s in document.steps]
    owners += [(f"event {i}", e.run_id) for i, e in enumerate(document.events)]
    owners += [(f"tool record {r.key!r}", r.run_id) for r in document.tool_records]
    owners += [(f"signal {i}", s.run_id) for i, s in enumerate(document.signals)]
    for what, run_id in owners:
        if run_id != run.run_id:
            raise BadArchive(f"{what} belongs to run {run_id!r}, not {run.run_id!r}")
    for i, kept in enumerate(document.signals):
        if kept.name == MESSAGE:
            if not (isinstance(kept.data, dict) and isinstance(kept.data.get("text"), str)):
                raise BadArchive(f'signals.{i}: a user\'s message holds {{"text": ...}}')
            continue
        if not _EARLY_ANSWER.fullmatch(kept.name):
            try:
                signal_name(kept.name, f"signals.{i}.name")
            except BadInput as err:
                raise BadArchive(f"invalid document: {err}") from None
    if (run.parent_run is None) != (run.parent_step is None):
        raise BadArchive("run.parent_run and run.parent_step go together, or neither is set")
    if run.parent_run is not None and run.run_id != f"{run.parent_run}:{run.parent_step}":
        raise BadArchive(
            f"a child run's id is its parent's and step's, {run.parent_run}:{run.parent_step}, "
            f"not {run.run_id!r}"
        )
    for position, step in enumerate(document.steps):
        if step.idx != position:
            raise BadArchive(
                f"step indexes must be 0..{n - 1} in order: index {step.idx} at position {position}"
            )
    if run.step_count != n or run.cursor > n:
        raise BadArchive(
            f"the run says {run.step_count} steps (cursor {run.cursor}), the document has {n}"
        )
    if (run.forked_from_run is None) != (run.forked_from_step is None):
        raise BadArchive("forked_from_run and forked_from_step go together")
    if run.forked_from_step is not None and run.forked_from_step >= n:
        raise BadArchive(
            f"forked_from_step {run.forked_from_step} is not a step of the run (it has {n})"
        )
    if run.replay_of_run is None and run.replay_live_reads:
        raise BadArchive("replay_live_reads is set on a run that is not a replay")
    for i, event in enumerate(document.events):
        if event.step_index is not None and event.step_index >= n:
            raise BadArchive(f"event {i} names step {event.step_index}, which the run lacks")
    keys: set[str] = set()
    for record in document.tool_records:
        if record.key != f"{run.run_id}:{record.step_index}" or record.step_index >= n:
            raise BadArchive(f"tool record {record.key!r} is not the key of a step of this run")
        if record.key in keys:
            raise BadArchive(f"tool record {record.key!r} appears twice")
        keys.add(record.key)


#: What a run not finished may have at its cursor, by its status.
_AT_CURSOR = {
    RunStatus.PENDING: (StepStatus.PENDING, StepStatus.RUNNING),
    RunStatus.RUNNING: (StepStatus.PENDING, StepStatus.RUNNING),
    RunStatus.PAUSED: (StepStatus.PENDING, StepStatus.RUNNING),
    RunStatus.WAITING: (StepStatus.IN_DOUBT, StepStatus.AWAITING_APPROVAL),
}
#: Why, for each status, anything else is refused.
_WHY_AT_CURSOR = {
    RunStatus.WAITING: "a run waits on a call in doubt or awaiting approval; "
    "no operator action would apply",
}
_MOVING = "only a waiting run holds a call for an operator; a worker would find nothing to run"
#: What else a waiting run may have at its cursor while deferred calls of the
#: turn before it are out (``deferred_from``): the model turn that waits for them.
_AT_WAITING_TURN = (StepStatus.PENDING,)


def waits_on_calls(document: Document) -> bool:
    """Does the run wait on deferred calls at its model turn (not on an operator)?"""
    run, steps = document.run, document.steps
    at = steps[run.cursor] if run.cursor < len(steps) else None
    return (
        run.status is RunStatus.WAITING
        and run.deferred_from is not None
        and at is not None
        and at.kind is StepKind.MODEL
    )


def where(step: StepDoc) -> str:
    return f"step {step.idx} ({step.kind.value}, {step.status.value})"


def check_state(document: Document) -> None:
    """A state the engine can reach (see the module docstring)."""
    # created_at and updated_at are not compared: they come from different
    # machines' clocks (the starter's, the last worker's), which may disagree.
    run, steps = document.run, document.steps
    for step in steps:
        _check_step(step, run.cursor)
    if run.status.terminal:
        return
    _check_deferred(document)
    if run.cursor >= len(steps):
        raise BadArchive(
            f"a {run.status.value} run has no step at its cursor {run.cursor} "
            f"(it has {len(steps)}): nothing could run next"
        )
    current = steps[run.cursor]
    if current.status.settled:
        raise BadArchive(
            f"a {run.status.value} run's step at its cursor {run.cursor} "
            f"is already {current.status.value}: nothing could run next"
        )
    allowed: tuple[StepStatus, ...] = _AT_CURSOR[run.status]
    if waits_on_calls(document):
        allowed = (*allowed, *_AT_WAITING_TURN)
    if current.status not in allowed:
        raise BadArchive(
            f"a {run.status.value} run's step at its cursor {run.cursor} is "
            f"{current.status.value}: {_WHY_AT_CURSOR.get(run.status, _MOVING)}"
        )
    last = len(steps) - 1
    for step in steps[run.cursor :]:
        if step.kind is StepKind.MODEL and step.idx != last:
            raise BadArchive(
                f"{where(step)} is not the run's last step: its turn is to add the steps after it"
            )
        if step.kind is StepKind.TOOL and step.idx == last:
            raise BadArchive(
                f"{where(step)} is the run's last step: no model turn would read its result"
            )
    _check_room(document)


def _check_step(step: StepDoc, cursor: int) -> None:
    if (step.kind is StepKind.TOOL) != (step.tool is not None):
        need = "names no tool" if step.tool is None else f"names a tool ({step.tool!r})"
        raise BadArchive(f"{where(step)} {need}")
    if step.kind is StepKind.MODEL:
        if step.status in (StepStatus.IN_DOUBT, StepStatus.AWAITING_APPROVAL):
            raise BadArchive(f"{where(step)}: a model step is never {step.status.value}")
        turn = step.args.get("turn")
        if set(step.args) != {"turn"} or type(turn) is not int or not 0 <= turn <= MAX_INT:
            raise BadArchive(f'{where(step)}: its arguments must be {{"turn": N}}, its turn number')
    _check_wait(step)
    if step.status is StepStatus.DEFERRED and step.idx == cursor:
        raise BadArchive(
            f"{where(step)} is at the cursor {cursor}: a run moves past a call that defers"
        )
    if step.idx < cursor and not (step.status.settled or step.status is StepStatus.DEFERRED):
        raise BadArchive(
            f"{where(step)} is before the cursor {cursor}: not done, failed or deferred"
        )
    if step.status is StepStatus.RUNNING and step.idx != cursor:
        raise BadArchive(f"{where(step)} is not at the cursor {cursor}")
    if step.idx > cursor and step.status is not StepStatus.PENDING:
        raise BadArchive(
            f"{where(step)} is after the cursor {cursor}: not pending, yet no step after "
            "the cursor has run"
        )


def _check_wait(step: StepDoc) -> None:
    """A deferred call says what it waits for, as harness.records.Wait stores
    it; a step that is no call waits for nothing."""
    if step.kind is StepKind.MODEL and (step.status is StepStatus.DEFERRED or step.wait):
        raise BadArchive(f"{where(step)}: a model step never defers")
    if step.wait is None:
        if step.status is StepStatus.DEFERRED:
            raise BadArchive(f"{where(step)} says nothing of what it waits for (no wait)")
        return
    found = Wait.from_json(step.wait)
    kind_needs = {WaitKind.SIGNAL: "signal", WaitKind.CHILD: "child", WaitKind.SLEEP: "until"}
    needed = None if found is None else kind_needs.get(found.kind)
    if (
        found is None
        or found.to_json() != step.wait
        or (needed is not None and getattr(found, needed) is None)
    ):
        raise BadArchive(
            f"steps.{step.idx}.wait: not a wait this harness stores (its kind one of "
            f"{', '.join(k.value for k in WaitKind)}, a signal's name, a child's run id, "
            "a sleep's end)"
        )
    if found.until is not None and not 0 <= found.until <= MAX_TIME:
        raise BadArchive(f"steps.{step.idx}.wait: until {found.until} is not a time")
    if found.child is not None and found.child != f"{step.run_id}:{step.idx}":
        raise BadArchive(
            f"steps.{step.idx}.wait: a call waits only on the child it started, "
            f"{step.run_id}:{step.idx}, not {found.child!r}"
        )


def _check_deferred(document: Document) -> None:
    """Deferred calls where the engine leaves them in a run not finished: all
    from ``deferred_from`` on, which marks a call of the turn the cursor is
    in; a model turn between would have waited for them."""
    run, steps = document.run, document.steps
    deferred = [s for s in steps if s.status is StepStatus.DEFERRED]
    start = run.deferred_from
    if start is None:
        if deferred:
            raise BadArchive(
                f"{where(deferred[0])} waits, yet the run marks no deferred call "
                "(deferred_from): its next model turn would not wait for it"
            )
        return
    if start >= run.cursor or start >= len(steps) or steps[start].kind is not StepKind.TOOL:
        raise BadArchive(
            f"deferred_from {start} is not a call before the cursor {run.cursor}: "
            "it marks the first call of the current turn that deferred"
        )
    for step in steps[start : run.cursor]:
        if step.kind is StepKind.MODEL:
            raise BadArchive(
                f"{where(step)} is between deferred_from {start} and the cursor: "
                "a model turn waits for the calls before it, and clears the mark"
            )
    for step in deferred:
        if step.idx < start:
            raise BadArchive(
                f"{where(step)} is before deferred_from {start}: the model turn after "
                "it would have waited for its answer"
            )


def _check_room(document: Document) -> None:
    """The counters a moving run's next writes raise stay within their columns."""
    run = document.run
    counters = [
        ("run.version", run.version),
        ("run.step_count", run.step_count),
        ("run.input_tokens", run.input_tokens),
        ("run.output_tokens", run.output_tokens),
    ]
    for step in document.steps[run.cursor :]:
        counters += [(f"steps.{step.idx}.attempts", step.attempts)]
        counters += [(f"steps.{step.idx}.retries", step.retries)]
    for name, value in counters:
        if value > MAX_INT - ROOM:
            raise BadArchive(
                f"{name} is {value}: too close to the integer columns' bound ({MAX_INT}) "
                "for the run to go on"
            )


# -- approvals -------------------------------------------------------------------


class Approval(BaseModel):
    """The fields of an operator's word the engine reads (harness.records.Step);
    other keys are kept as they are."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True, allow_inf_nan=False)

    decision: Literal["approved", "rejected"]
    by: Annotated[str, Field(max_length=200)]
    at: Annotated[float, Field(ge=0, le=MAX_TIME)]
    reason: str | None = None
    proposed_args: dict[str, Any] | None = None


#: Where a word is kept: the call was decided (see the module docstring).
_ACTED_ON = (
    StepStatus.DONE,
    StepStatus.FAILED,
    StepStatus.IN_DOUBT,
    StepStatus.RUNNING,
    StepStatus.DEFERRED,
)


def check_approvals(document: Document) -> None:
    """Each word well formed, on a tool call, and one its step's status can follow."""
    finished = document.run.status.terminal
    for step in document.steps:
        if step.approval is None:
            continue
        if step.kind is StepKind.MODEL:
            raise BadArchive(f"{where(step)} carries an approval: only a tool call has one")
        try:
            word = Approval.model_validate(step.approval)
        except ValidationError as err:
            raise BadArchive(
                f"invalid document: {describe(err, f'steps.{step.idx}.approval')}"
            ) from None
        rejected = word.decision == "rejected"
        if rejected and step.status in (StepStatus.DONE, StepStatus.IN_DOUBT, StepStatus.DEFERRED):
            raise BadArchive(
                f"{where(step)} was rejected, yet {step.status.value}: "
                "a rejected call is never made"
            )
        if not rejected and step.status is StepStatus.RUNNING and not finished:
            raise BadArchive(
                f"{where(step)} was approved on the exporting deployment and its call may be "
                "under way there: export the run again once the call has settled"
            )


def carried_approval(step: StepDoc) -> dict[str, JSON] | None:
    """The word the imported step keeps: none on a call not made yet."""
    return step.approval if step.status in _ACTED_ON else None
