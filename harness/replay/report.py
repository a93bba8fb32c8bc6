"""What a replay did against its recording: where it left it, and what it cost.

The comparison walks both runs step by step (positions line up while the
replay follows its recording, see harness.engine.cassette). The first
position where they differ is the divergence: another tool or other
arguments, a model that answered where the recording called a tool (or the
other way round), or a different ending. Its report gives the two calls,
the arguments that changed, and the diff of what the model said in the turn
that led there. The final answers are shown side by side, with the token
and cost deltas (replay minus recording).
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean

from harness.engine.cassette import LIVE, SERVED, asked_for, describe_call, same_call
from harness.errors import OperatorError, RunNotFound
from harness.records import JSON, Event, Run, RunStatus, Step, StepKind, StepStatus
from harness.store import Store

#: Lines of a text diff kept in a report.
MAX_DIFF_LINES = 40
_ABSENT = object()


class Outcome:
    """How a replay compares with its recording."""

    MATCHED = "matched"  # the same calls at every step, and the same ending
    DIVERGED = "diverged"  # see the report's divergence
    CANCELLED = "cancelled"  # cancelled before it diverged or ended
    HELD = "held"  # waits for an operator (paused: a budget, or asked for)
    UNFINISHED = "unfinished"  # still moving when the report was made


#: Every outcome, in the order a summary gives them.
OUTCOMES = (Outcome.MATCHED, Outcome.DIVERGED, Outcome.CANCELLED, Outcome.HELD, Outcome.UNFINISHED)


@dataclass(frozen=True)
class Side:
    """One of the two runs compared."""

    run_id: str
    agent: str
    status: str
    steps: int  # settled (done or failed)
    input_tokens: int
    output_tokens: int
    cost_usd: float
    answer: str | None
    error: str | None

    @classmethod
    def of(cls, run: Run, steps: Sequence[Step]) -> Side:
        return cls(
            run.run_id,
            run.agent,
            run.status.value,
            len(_settled(steps)),
            run.input_tokens,
            run.output_tokens,
            round(run.cost_usd, 6),
            run.result,
            run.error,
        )

    def to_dict(self) -> dict[str, JSON]:
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "status": self.status,
            "steps": self.steps,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
            "cost_usd": self.cost_usd,
            "answer": self.answer,
            "error": self.error,
        }


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


@dataclass(frozen=True)
class ReplayReport:
    recording: Side
    replay: Side
    outcome: str
    live_read_only: bool
    #: Positions compared: every step of the replay that settled (done or
    #: failed, the one where it stopped included).
    steps_compared: int
    #: Tool calls answered from the recording, and calls made live (read_only).
    served: int
    live: int
    divergence: Divergence | None

    @property
    def same_answer(self) -> bool:
        return self.recording.answer == self.replay.answer

    @property
    def delta(self) -> dict[str, JSON]:
        """Replay minus recording."""
        return {
            "input_tokens": self.replay.input_tokens - self.recording.input_tokens,
            "output_tokens": self.replay.output_tokens - self.recording.output_tokens,
            "cost_usd": round(self.replay.cost_usd - self.recording.cost_usd, 6),
        }

    def to_dict(self) -> dict[str, JSON]:
        return {
            "outcome": self.outcome,
            "recording": self.recording.to_dict(),
            "replay": self.replay.to_dict(),
            "live_read_only": self.live_read_only,
            "steps_compared": self.steps_compared,
            "served": self.served,
            "live": self.live,
            "divergence": None if self.divergence is None else self.divergence.to_dict(),
            "same_answer": self.same_answer,
            "delta": self.delta,
        }

    def lines(self) -> list[str]:
        """The report as text, for a terminal."""
        rec, rep = self.recording, self.replay
        head = f"replay {rep.run_id} of {rec.run_id} ({rec.agent} -> {rep.agent}): {self.outcome}"
        if self.divergence is not None:
            head += f" at step {self.divergence.step}"
        out = [
            head,
            f"  steps compared: {self.steps_compared}; tool calls served from the recording: "
            f"{self.served}; made live: {self.live}",
        ]
        if self.divergence is not None:
            out += _divergence_lines(self.divergence)
        out += [
            "  final answer:",
            f"    recording ({rec.status}): {_answer(rec)}",
            f"    replay    ({rep.status}): {_answer(rep)}",
            f"  tokens: {rec.input_tokens} in / {rec.output_tokens} out -> {rep.input_tokens} in "
            f"/ {rep.output_tokens} out ({_signed(self.delta['input_tokens'])} / "
            f"{_signed(self.delta['output_tokens'])})",
            f"  cost: ${rec.cost_usd:.6f} -> ${rep.cost_usd:.6f} "
            f"({_signed(self.delta['cost_usd'], money=True)})",
        ]
        return out


def report(store: Store, replay_id: str) -> ReplayReport:
    """The replay ``replay_id`` against its recording, as both stand now.
    Raises RunNotFound, or OperatorError if it is no replay or its
    recording was deleted."""
    replay = store.load(replay_id)
    if replay.replay_of is None:
        raise OperatorError(f"run {replay_id} is not a replay")
    try:
        recording = store.load(replay.replay_of.run_id)
    except RunNotFound:
        raise OperatorError(
            f"the recording of replay {replay_id}, run {replay.replay_of.run_id}, "
            "no longer exists (pruned?)"
        ) from None
    return compare(
        recording,
        store.steps(recording.run_id),
        replay,
        store.steps(replay_id),
        answered(store.events(replay_id)),
    )


def answered(events: Sequence[Event]) -> dict[int, str]:
    """How each tool call of a replay was answered (SERVED or LIVE), from the
    notes the cassette left on its steps' events."""
    found: dict[int, str] = {}
    for event in events:
        detail = event.detail or ""
        if event.step_index is not None:
            for note in (SERVED, LIVE):
                if detail.startswith(note):
                    found[event.step_index] = note
    return found


def compare(
    recording: Run,
    recorded: Sequence[Step],
    replay: Run,
    replayed: Sequence[Step],
    how: Mapping[int, str],
) -> ReplayReport:
    """The report of ``replay`` (whose steps are ``replayed``, its calls
    answered as ``how`` says: :func:`answered`) against ``recording``
    (``recorded``)."""
    origin = replay.replay_of
    settled = _settled(replayed)
    divergence: Divergence | None = None
    for mine in settled:
        theirs = recorded[mine.index] if mine.index < len(recorded) else None
        divergence = _differs(mine, theirs, recorded, replayed, how.get(mine.index))
        if divergence is not None:
            break
    if divergence is not None:
        outcome = Outcome.DIVERGED
    elif replay.status is RunStatus.CANCELLED:
        outcome = Outcome.CANCELLED
    elif replay.status.held:
        outcome = Outcome.HELD
    elif not replay.status.terminal:
        outcome = Outcome.UNFINISHED
    else:
        divergence = _ending(recording, recorded, replay, settled)
        outcome = Outcome.MATCHED if divergence is None else Outcome.DIVERGED
    notes = [how.get(s.index) for s in settled if s.kind is StepKind.TOOL]
    return ReplayReport(
        Side.of(recording, recorded),
        Side.of(replay, replayed),
        outcome,
        bool(origin and origin.live_read_only),
        len(settled),
        notes.count(SERVED),
        notes.count(LIVE),
        divergence,
    )


def _settled(steps: Sequence[Step]) -> list[Step]:
    return [s for s in steps if s.status.settled]


def _differs(
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


def _ending(
    recording: Run, recorded: Sequence[Step], replay: Run, settled: Sequence[Step]
) -> Divergence | None:
    """The same calls at every step the replay made: did it end the same way?"""
    theirs = _settled(recorded)
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
    result = step.result if isinstance(step.result, dict) else {}
    final = result.get("final")
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


def _divergence_lines(d: Divergence) -> list[str]:
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


def _answer(side: Side) -> str:
    if side.answer is not None:
        return repr(side.answer)
    if side.status == RunStatus.DIVERGED:
        return "(none: it stopped where it diverged)"
    return f"(none{': ' + side.error if side.error else ''})"


def _signed(value: JSON, money: bool = False) -> str:
    number = float(value)
    sign = "+" if number >= 0 else "-"
    return f"{sign}${abs(number):.6f}" if money else f"{sign}{abs(int(number))}"


@dataclass(frozen=True)
class BatchReport:
    """Many replays of one agent, summed up."""

    agent: str
    reports: list[ReplayReport]

    def counts(self) -> dict[str, int]:
        found = Counter(r.outcome for r in self.reports)
        return {o: found.get(o, 0) for o in OUTCOMES}

    def where(self) -> list[dict[str, JSON]]:
        """Where replays diverged: by step and tool (or kind), most frequent first."""
        found = Counter(
            (r.divergence.step, r.divergence.replayed_tool or r.divergence.kind)
            for r in self.reports
            if r.divergence is not None
        )
        return [
            {"step": step, "at": at, "count": count}
            for (step, at), count in sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))
        ]

    def mean_delta(self) -> dict[str, JSON]:
        if not self.reports:
            return {"input_tokens": 0.0, "output_tokens": 0.0, "cost_usd": 0.0}
        deltas = [r.delta for r in self.reports]
        return {
            "input_tokens": round(fmean(float(d["input_tokens"]) for d in deltas), 1),
            "output_tokens": round(fmean(float(d["output_tokens"]) for d in deltas), 1),
            "cost_usd": round(fmean(float(d["cost_usd"]) for d in deltas), 6),
        }

    def to_dict(self) -> dict[str, JSON]:
        return {
            "agent": self.agent,
            "runs": len(self.reports),
            **self.counts(),
            "diverged_at": self.where(),
            "mean_delta": self.mean_delta(),
            "replays": [r.to_dict() for r in self.reports],
        }

    def summary(self) -> list[str]:
        counts, mean = self.counts(), self.mean_delta()
        others = ", ".join(f"{counts[o]} {o}" for o in OUTCOMES[2:] if counts[o])
        out = [
            f"replayed {len(self.reports)} runs as {self.agent}: {counts['matched']} matched, "
            f"{counts['diverged']} diverged" + (f", {others}" if others else "")
        ]
        if self.where():
            where = ", ".join(f"step {w['step']} {w['at']} x{w['count']}" for w in self.where())
            out.append(f"diverged at: {where}")
        out.append(
            f"mean delta per run: {mean['input_tokens']:+.1f} input tokens, "
            f"{mean['output_tokens']:+.1f} output tokens, "
            f"{_signed(mean['cost_usd'], money=True)}"
        )
        return out
