"""Models: parsing a turn, and the deterministic ScriptedModel."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import harness
from harness.errors import HarnessError, ModelError
from harness.models import (
    MAX_TOKENS,
    ModelRequest,
    ModelTurn,
    ScriptedModel,
    ToolCall,
    Usage,
    token_count,
)


def _request(turn: int) -> ModelRequest:
    return ModelRequest(run_id="r", goal="g", turn=turn, step_index=2 * turn, history=list)


# -- ModelTurn.parse -----------------------------------------------------------


def test_parse_final() -> None:
    turn = ModelTurn.parse({"final": "all done"})
    assert turn == ModelTurn(final="all done")
    assert turn.tool_calls == ()


def test_parse_tool_calls() -> None:
    turn = ModelTurn.parse({"tool_calls": [{"name": "add", "args": {"a": 1}}, {"name": "ping"}]})
    assert turn.final is None
    assert turn.tool_calls == (ToolCall("add", {"a": 1}), ToolCall("ping", {}))


def test_parse_copies_the_args() -> None:
    args = {"a": 1}
    turn = ModelTurn.parse({"tool_calls": [{"name": "add", "args": args}]})
    args["a"] = 2
    assert turn.tool_calls[0].args == {"a": 1}


def test_parse_accepts_a_tuple_of_calls() -> None:
    turn = ModelTurn.parse({"tool_calls": ({"name": "ping", "args": {}},)})
    assert turn.tool_calls == (ToolCall("ping"),)


@pytest.mark.parametrize("raw", [[{"final": "x"}], "final", None, 3])
def test_a_turn_that_is_not_a_mapping_is_rejected(raw: Any) -> None:
    with pytest.raises(ModelError, match=f"a turn must be a mapping, not {type(raw).__name__}"):
        ModelTurn.parse(raw)


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"tool_calls": []},
        {"tool_calls": None},
        {"tool_calls": "add"},
        {"tool_calls": {"name": "add"}},
        {"answer": "42"},
    ],
)
def test_a_turn_needs_final_or_a_non_empty_tool_calls_list(raw: dict[str, Any]) -> None:
    with pytest.raises(ModelError, match="a turn needs 'final' or a non-empty 'tool_calls' list"):
        ModelTurn.parse(raw)


@pytest.mark.parametrize(
    "call", [{"args": {"a": 1}}, {"name": 3}, {"name": None}, "add", ["add", {}]]
)
def test_a_tool_call_needs_a_name(call: Any) -> None:
    with pytest.raises(ModelError, match="a tool call needs a 'name'"):
        ModelTurn.parse({"tool_calls": [call]})


@pytest.mark.parametrize("args", [[1, 2], "a=1", 5, None])
def test_tool_call_args_must_be_a_mapping(args: Any) -> None:
    with pytest.raises(ModelError, match="tool call args must be a mapping"):
        ModelTurn.parse({"tool_calls": [{"name": "add", "args": args}]})


def test_one_bad_call_rejects_the_whole_turn() -> None:
    with pytest.raises(ModelError, match="needs a 'name'"):
        ModelTurn.parse({"tool_calls": [{"name": "ok"}, {"nom": "bad"}]})


def test_final_none_is_not_the_answer_none() -> None:
    """A null final answer must not become the literal text "None"."""
    with pytest.raises(ModelError):
        ModelTurn.parse({"final": None})


def test_model_error_is_a_harness_error() -> None:
    assert issubclass(ModelError, HarnessError)


# -- ScriptedModel -------------------------------------------------------------


SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "add", "args": {"a": 1}}]},
    {"tool_calls": [{"name": "add", "args": {"a": 2}}, {"name": "ping"}]},
    {"final": "3"},
]


def test_scripted_model_answers_turn_i_with_turns_i() -> None:
    model = ScriptedModel(SCRIPT)
    for i, raw in enumerate(SCRIPT):
        assert model.next_turn(_request(i)) == ModelTurn.parse(raw)


def test_scripted_model_is_deterministic_and_order_free() -> None:
    model = ScriptedModel(SCRIPT)
    assert model.next_turn(_request(2)) == ModelTurn(final="3")
    assert model.next_turn(_request(0)) == model.next_turn(_request(0))


def test_asking_beyond_the_script_is_a_model_error() -> None:
    model = ScriptedModel(SCRIPT)
    with pytest.raises(ModelError, match="ScriptedModel has 3 turns; turn 3 was asked for"):
        model.next_turn(_request(3))


def test_empty_script_has_no_turns() -> None:
    with pytest.raises(ModelError, match="ScriptedModel has 0 turns; turn 0 was asked for"):
        ScriptedModel([]).next_turn(_request(0))


@pytest.mark.parametrize(
    "turns",
    [
        [{"final": "ok"}, {}],
        [{"tool_calls": [{"args": {}}]}],
        [{"tool_calls": [{"name": "x", "args": [1]}]}],
        ["final"],
    ],
)
def test_malformed_script_is_rejected_at_construction(turns: list[Any]) -> None:
    with pytest.raises(ModelError):
        ScriptedModel(turns)


def test_scripted_model_is_exported_from_harness() -> None:
    assert harness.ScriptedModel is ScriptedModel
    assert harness.ModelTurn is ModelTurn


def test_arguments_no_parser_can_read_are_kept_as_text() -> None:
    """A 5,000-digit number or nesting deeper than Python's parser follows:
    the call is answered with an error, the turn is not lost."""
    from harness.providers.base import tool_call

    for raw in ('{"n": ' + "9" * 5000 + "}", "[" * 100_000 + "]" * 100_000):
        parsed = tool_call("f", raw, "c1")  # both providers' streamed arguments
        assert parsed.args == {} and parsed.raw_arguments == raw


def test_a_reader_writes_an_integer_too_long_to_print() -> None:
    from harness.inputs import render_json

    assert render_json({"n": 10**5000}) == '{"n": "<an integer of 16610 bits>"}'


@pytest.mark.parametrize("price", ["Infinity", "NaN", "-1"])
def test_a_price_must_be_a_finite_number(price: str) -> None:
    from harness.errors import ConfigError
    from harness.providers.prices import Prices

    with pytest.raises(ConfigError, match="must be a finite number >= 0"):
        Prices.parse('{"m": {"input": ' + price + ', "output": 1}}')


@given(
    st.one_of(
        st.integers(),
        st.integers(min_value=10**999, max_value=10**6000),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
        st.none(),
        st.booleans(),
    )
)
def test_a_reported_token_count_is_a_count_a_column_holds_or_a_one_line_error(raw: Any) -> None:
    """The usage door (harness.models.token_count, then Usage): anything a
    provider's JSON may carry ends as a stored count, or a ModelError on one line."""
    try:
        usage = Usage(token_count("input_tokens", raw), 0)
    except ModelError as err:
        assert "\n" not in str(err) and "input_tokens" in str(err)
        return
    assert 0 <= usage.input_tokens <= MAX_TOKENS and usage.input_tokens == raw
