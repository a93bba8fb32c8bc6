"""What a replay did against its recording: where it left it, and what it cost.

The comparison walks both runs step by step (positions line up while the
replay follows its recording, see harness.engine.cassette). The first
position where they differ is the divergence (harness.replay.divergence):
another tool or other arguments, a model that answered where the recording
called a tool (or the other way round), or a different ending. Its report
gives the two calls, the arguments that changed, and the diff of what the
model said in the turn that led there. The final answers are shown side by
side, with the token and cost deltas (replay minus recording). Each report
ends in a :class:`ReplayVerdict`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from harness.engine.cassette import LIVE, SERVED
from harness.errors import OperatorError, RunNotFound
from harness.records import JSON, Event, Run, RunStatus, Step, StepKind
from harness.replay.divergence import Divergence, at_end, at_step, divergence_lines, settled_steps
from harness.store import Store


class ReplayVerdict:
    """How a replay compares with its recording (a report's ``outcome``)."""

    MATCHED = "matched"  # the same calls at every step, and the same ending
    DIVERGED = "diverged"  # see the report's divergence
    CANCELLED = "cancelled"  # cancelled before it diverged or ended
    HELD = "held"  # waits for an operator (paused: a budget, or asked for)
    UNFINISHED = "unfinished"  # still moving when the report was made


#: Every verdict, in the order a summary gives them.
VERDICTS = (
    ReplayVerdict.MATCHED,
    ReplayVerdict.DIVERGED,
    ReplayVerdict.CANCELLED,
    ReplayVerdict.HELD,
    ReplayVerdict.UNFINISHED,
)


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
            len(settled_steps(steps)),
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
            out += divergence_lines(self.divergence)
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
    settled = settled_steps(replayed)
    divergence: Divergence | None = None
    for mine in settled:
        theirs = recorded[mine.index] if mine.index < len(recorded) else None
        divergence = at_step(mine, theirs, recorded, replayed, how.get(mine.index))
        if divergence is not None:
            break
    if divergence is not None:
        outcome = ReplayVerdict.DIVERGED
    elif replay.status is RunStatus.CANCELLED:
        outcome = ReplayVerdict.CANCELLED
    elif replay.status.held:
        outcome = ReplayVerdict.HELD
    elif not replay.status.terminal:
        outcome = ReplayVerdict.UNFINISHED
    else:
        divergence = at_end(recording, recorded, replay, settled)
        outcome = ReplayVerdict.MATCHED if divergence is None else ReplayVerdict.DIVERGED
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
        return {o: found.get(o, 0) for o in VERDICTS}

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
        others = ", ".join(f"{counts[o]} {o}" for o in VERDICTS[2:] if counts[o])
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
