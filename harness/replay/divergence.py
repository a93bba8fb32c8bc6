"""Where a replay first left its recording, and how to show it.

A replay's steps are compared with its recording's position by position
(positions line up while the replay follows its recording, see
harness.engine.cassette). The first position where they differ is the
:class:`Divergence`: another tool or other arguments, a model that answered
where the recording called a tool (or the other way round), or a different
ending. It carries the two calls, the arguments that changed, and the diff
of what the model said in the turn that led there. harness.replay.report
puts it in a replay's report.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.engine.cassette import SERVED, asked_for, describe_call, same_call
from harness.records import JSON, Run, Step, StepKind, StepStatus

#: Lines of a text diff kept in a report.
MAX_DIFF_LINES = 40
_ABSENT = object()


@dataclass(frozen=True)
class Divergence:
    """The first position where the replay left its recording."""

    step: int
    kind: str  # "tool": another call; "model": answered instead of calling, or
    # the reverse; "end": the same calls, another ending
    recorded: str
    replayed: str
    #: The tool at that position in each run (None: not a tool call there).
    recorded_tool: str | None = None
    replayed_tool: str | None = None
    #: ``{"arg", "recorded"?, "replayed"?}`` per argument that differs (a side
    #: without the argument leaves its key out).
    args_diff: list[dict[str, JSON]] = field(default_factory=list)
    #: A unified diff of what the model said in the turn that led here.
    text_diff: list[str] = field(default_factory=list)
    #: The model step whose text is diffed.
    text_step: int | None = None

    def to_dict(self) -> dict[str, JSON]:
        return {
            "step": self.step,
            "kind": self.kind,
            "recorded": self.recorded,
            "replayed": self.replayed,
            "recorded_tool": self.recorded_tool,
            "replayed_tool": self.replayed_tool,
            "args_diff": self.args_diff,
            "text_step": self.text_step,
            "text_diff": self.text_diff,
        }


def settled_steps(steps: Sequence[Step]) -> list[Step]:
    """The steps that settled (done or failed): the positions a report compares."""
    return [s for s in steps if s.status.settled]


def at_step(
    mine: Step,
    theirs: Step | None,
    recorded: Sequence[Step],
    replayed: Sequence[Step],
    how: str | None,
) -> Divergence | None:
    """How the replay's step ``mine`` (its call answered ``how``) differs from
    the recording's step at its position."""
    if mine.kind is StepKind.TOOL:
        if same_call(theirs, mine.tool, mine.args):
            assert theirs is not None
            if how == SERVED:
                return None
            # The same call, not answered from the recording: the agent lacks
            # the tool, or the recorded call never settled.
            return Divergence(
                mine.index,
                "outcome",
                f"{describe_call(theirs)}: {theirs.status.value}",
                f"{describe_call(mine)}: {mine.status.value}"
                + (f" ({mine.error})" if mine.error else ""),
                theirs.tool,
                mine.tool,
            )
        called = theirs if theirs is not None and theirs.kind is StepKind.TOOL else None
        recorded_tool = None if called is None else called.tool
        text_step, text_diff = _turn_text_diff(mine.index, recorded, replayed)
        return Divergence(
            mine.index,
            StepKind.TOOL.value,
            describe_call(theirs),
            describe_call(mine),
            recorded_tool,
            mine.tool,
            _args_diff({} if called is None else asked_for(called), mine.args),
            text_diff,
            text_step,
        )
    if mine.status is StepStatus.FAILED:
        return None  # the model failed: no turn to compare (the ending differs)
    if theirs is None or theirs.kind is not StepKind.MODEL:
        return Divergence(
            mine.index,
            StepKind.MODEL.value,
            describe_call(theirs),
            "a model turn",
            recorded_tool=None if theirs is None else theirs.tool,
        )
    mine_final, theirs_final = _final(mine), _final(theirs)
    if (mine_final is None) == (theirs_final is None):
        return None  # both answered (compared at the end), or both called (compared per call)
    return Divergence(
        mine.index,
        StepKind.MODEL.value,
        _turn(theirs),
        _turn(mine),
        text_diff=_text_diff(_said(theirs), _said(mine)),
        text_step=mine.index,
    )


def at_end(
    recording: Run, recorded: Sequence[Step], replay: Run, settled: Sequence[Step]
) -> Divergence | None:
    """The same calls at every step the replay made: did it end the same way?"""
    theirs = settled_steps(recorded)
    if replay.status is recording.status and len(settled) == len(theirs):
        return None
    last = settled[-1].index if settled else 0
    return Divergence(
        last,
        "end",
        f"{recording.status.value} after {len(theirs)} steps"
        + (f": {recording.error}" if recording.error else ""),
        f"{replay.status.value} after {len(settled)} steps"
        + (f": {replay.error}" if replay.error else ""),
    )


def _final(step: Step) -> str | None:
    """The step's final answer as text (a structured one as its JSON), or None."""
    result = step.result if isinstance(step.result, dict) else {}
    final = result.get("final")
    if isinstance(final, dict):
        return json.dumps(final, sort_keys=True, indent=1)
    return final if isinstance(final, str) else None


def _said(step: Step | None) -> str:
    """What the model said at a model step: its final answer, or its text
    beside the calls (with the calls, so that a changed call shows)."""
    if step is None or not isinstance(step.result, dict):
        return ""
    final = _final(step)
    if final is not None:
        return final
    text = step.result.get("text") or ""
    return str(text)


def _turn(step: Step) -> str:
    if step.status is not StepStatus.DONE:
        return f"a model turn not taken ({step.status.value})"
    final = _final(step)
    if final is not None:
        return f"a final answer: {final!r}"
    calls = step.result.get("tool_calls") if isinstance(step.result, dict) else None
    names = ", ".join(str(c.get("name")) for c in calls or () if isinstance(c, dict))
    return f"a turn calling {names or 'nothing'}"


def _turn_text_diff(
    index: int, recorded: Sequence[Step], replayed: Sequence[Step]
) -> tuple[int | None, list[str]]:
    """The diff of the model turn before position ``index`` in each run."""
    mine = _turn_before(replayed, index)
    if mine is None:
        return None, []
    theirs = recorded[mine.index] if mine.index < len(recorded) else None
    if theirs is not None and theirs.kind is not StepKind.MODEL:
        theirs = None
    return mine.index, _text_diff(_said(theirs), _said(mine))


def _turn_before(steps: Sequence[Step], index: int) -> Step | None:
    return next((s for s in reversed(steps[:index]) if s.kind is StepKind.MODEL), None)


def _text_diff(recorded: str, replayed: str) -> list[str]:
    if recorded == replayed:
        return []
    diff = difflib.unified_diff(
        recorded.splitlines(), replayed.splitlines(), "recording", "replay", n=1, lineterm=""
    )
    lines = list(diff)
    return lines[:MAX_DIFF_LINES] + (["..."] if len(lines) > MAX_DIFF_LINES else [])


def _args_diff(recorded: dict[str, JSON], replayed: dict[str, JSON]) -> list[dict[str, JSON]]:
    changes = []
    for name in sorted(set(recorded) | set(replayed)):
        old, new = recorded.get(name, _ABSENT), replayed.get(name, _ABSENT)
        if old == new:
            continue
        change: dict[str, JSON] = {"arg": name}
        if old is not _ABSENT:
            change["recorded"] = old
        if new is not _ABSENT:
            change["replayed"] = new
        changes.append(change)
    return changes


def divergence_lines(d: Divergence) -> list[str]:
    """The divergence as indented lines of a replay report's text."""
    out = [
        f"  first divergence, step {d.step} ({d.kind}):",
        f"    recording: {d.recorded}",
        f"    replay:    {d.replayed}",
    ]
    if d.args_diff:
        out.append("    arguments:")
        for change in d.args_diff:
            if "recorded" in change:
                out.append(f"      - {change['arg']}: {json.dumps(change['recorded'])}")
            if "replayed" in change:
                out.append(f"      + {change['arg']}: {json.dumps(change['replayed'])}")
    if d.text_diff:
        out.append(f"    model text (step {d.text_step}):")
        out += [f"      {line}" for line in d.text_diff]
    return out
