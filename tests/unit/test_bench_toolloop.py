"""The agent loop every peer of bench.agentloop runs (bench.toolloop): its
figures are per step, so the step count of a run must be what they divide by."""

from __future__ import annotations

import pytest

from bench import toolloop


def test_a_run_is_seven_model_turns_and_six_tool_calls_in_turn() -> None:
    calls = [toolloop.next_call(turn) for turn in range(toolloop.TOOL_CALLS + 1)]
    assert calls[:-1] == [toolloop.NAMES[t % 3] for t in range(6)]
    assert calls[-1] is None  # the seventh turn answers
    assert len(set(calls[:-1])) == 3
    assert toolloop.STEPS_PER_RUN == len(calls) + toolloop.TOOL_CALLS == 13


def test_a_run_is_checked_against_its_tool_results() -> None:
    results = [toolloop.call(toolloop.NAMES[t % 3], t) for t in range(toolloop.TOOL_CALLS)]
    toolloop.expected(results)
    with pytest.raises(RuntimeError, match="tool results"):
        toolloop.expected(results[:-1])
