"""Tools and agents: the decorator, argument validation, effects, the agent registry."""

from __future__ import annotations

from typing import Any

import pytest

import harness
from harness import agents
from harness.agents import Agent, get_agent, register_agent
from harness.errors import (
    AgentNotFound,
    InvalidToolArgs,
    ToolError,
    ToolResultError,
    UnknownTool,
)
from harness.tools import ToolContext, ToolEffect, ToolSpec

CTX = ToolContext(run_id="run", step_index=3, attempt=1)


@harness.tool
def add(a: int, b: int = 2) -> int:
    """Add two numbers."""
    return a + b


@harness.tool(effect="at_most_once", name="send", description="Send a message.")
def send_message(to: str, ctx: harness.ToolContext, body: str = "hi") -> dict[str, Any]:
    return {"to": to, "body": body, "key": ctx.idempotency_key, "attempt": ctx.attempt}


@harness.tool(effect="read_only")
def returns(value: Any) -> Any:
    return value


def _model() -> harness.ScriptedModel:
    return harness.ScriptedModel([{"final": "done"}])


# -- the decorator -------------------------------------------------------------


def test_bare_decorator_makes_an_idempotent_tool_named_after_the_function() -> None:
    assert isinstance(add, ToolSpec)
    assert add.name == "add"
    assert add.effect is ToolEffect.IDEMPOTENT
    assert add.description == "Add two numbers."
    assert add.context_param is None
    assert repr(add) == "<tool add effect=idempotent>"


def test_decorator_with_arguments_sets_effect_name_and_description() -> None:
    assert send_message.name == "send"
    assert send_message.effect is ToolEffect.AT_MOST_ONCE
    assert send_message.description == "Send a message."
    assert send_message.context_param == "ctx"


@pytest.mark.parametrize("effect", ["read_only", "idempotent", "at_most_once"])
def test_every_effect_is_accepted_as_a_string(effect: str) -> None:
    spec = harness.tool(effect=effect)(lambda: None)
    assert spec.effect is ToolEffect(effect)


def test_effect_is_accepted_as_an_enum_member() -> None:
    spec = harness.tool(effect=ToolEffect.READ_ONLY)(lambda: None)
    assert spec.effect is ToolEffect.READ_ONLY


def test_only_at_most_once_is_unsafe_to_repeat() -> None:
    assert ToolEffect.READ_ONLY.safe_to_repeat
    assert ToolEffect.IDEMPOTENT.safe_to_repeat
    assert not ToolEffect.AT_MOST_ONCE.safe_to_repeat


def test_bad_effect_is_a_value_error_listing_the_choices() -> None:
    with pytest.raises(ValueError, match="effect must be one of") as info:
        harness.tool(effect="exactly_once")
    message = str(info.value)
    for choice in ("read_only", "idempotent", "at_most_once"):
        assert choice in message
    assert "'exactly_once'" in message


def test_calling_the_decorated_object_calls_the_plain_function() -> None:
    assert add(1) == 3
    assert add(1, b=10) == 11
    # No validation on a direct call: the plain function runs as written.
    assert add("x", "y") == "xy"
    assert send_message("bob", CTX) == {"to": "bob", "body": "hi", "key": "run:3", "attempt": 1}


@pytest.mark.parametrize(
    "source",
    [
        "def f(*items: int) -> None: ...",
        "def f(**options: int) -> None: ...",
        "def f(a: int, *rest: int, **more: int) -> None: ...",
    ],
)
def test_star_args_and_star_kwargs_are_rejected_at_decoration(source: str) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs are not supported"):
        harness.tool(namespace["f"])


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        # Positional-only: invoke() passes keyword arguments, so it can never bind.
        ("def f(x: int, /) -> int:\n    return x", "positional-only 'x' cannot be passed"),
        # A leading underscore: pydantic cannot make it a field.
        ("def f(_x: int) -> int:\n    return _x", "parameter '_x' cannot start with '_'"),
    ],
    ids=["positional-only", "leading-underscore"],
)
def test_a_parameter_the_harness_cannot_pass_is_rejected(source: str, reason: str) -> None:
    """Decoration must not accept a tool that no model call could ever invoke."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(TypeError, match=reason):
        harness.tool(namespace["f"])


# -- argument validation -------------------------------------------------------


def test_validate_applies_defaults() -> None:
    assert add.validate({"a": 1}) == {"a": 1, "b": 2}
    assert add.validate({"a": 1, "b": 5}) == {"a": 1, "b": 5}


def test_validate_coerces_numeric_strings_in_pydantic_lax_mode() -> None:
    assert add.validate({"a": "5"}) == {"a": 5, "b": 2}


def test_wrong_type_is_invalid_tool_args_naming_the_field() -> None:
    with pytest.raises(InvalidToolArgs, match=r"tool 'add'.*\bb: Input should be a valid integer"):
        add.validate({"a": 1, "b": "many"})


def test_float_with_a_fraction_is_not_an_int() -> None:
    with pytest.raises(InvalidToolArgs, match=r"a: .*fractional part"):
        add.validate({"a": 1.5})


def test_missing_required_argument_is_reported() -> None:
    with pytest.raises(InvalidToolArgs, match=r"a: Field required"):
        add.validate({"b": 1})


def test_unknown_argument_is_rejected() -> None:
    with pytest.raises(InvalidToolArgs, match=r"c: Extra inputs are not permitted"):
        add.validate({"a": 1, "c": 3})


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidToolArgs) as info:
        add.validate({"b": "x", "c": 3})
    message = str(info.value)
    assert "a: Field required" in message
    assert "b: Input should be a valid integer" in message
    assert "c: Extra inputs are not permitted" in message


def test_arguments_that_are_not_an_object_are_rejected() -> None:
    with pytest.raises(InvalidToolArgs, match="arguments for tool 'add' must be an object"):
        add.validate([1, 2])  # type: ignore[arg-type]


def test_invalid_tool_args_is_a_tool_error() -> None:
    assert issubclass(InvalidToolArgs, ToolError)
    assert issubclass(ToolResultError, ToolError)
    assert issubclass(UnknownTool, ToolError)


def test_unannotated_parameter_accepts_anything() -> None:
    @harness.tool
    def echo(value, times: int = 1):  # type: ignore[no-untyped-def]
        return [value] * times

    assert echo.validate({"value": {"nested": [1, 2]}}) == {"value": {"nested": [1, 2]}, "times": 1}


# -- the tool context ----------------------------------------------------------


def test_context_key_is_run_id_colon_step_index() -> None:
    assert CTX.idempotency_key == "run:3"
    assert ToolContext("run", 3, attempt=5).idempotency_key == "run:3"


def test_context_parameter_is_not_a_validated_argument() -> None:
    assert send_message.validate({"to": "bob"}) == {"to": "bob", "body": "hi"}


def test_passing_the_context_as_an_argument_is_rejected() -> None:
    with pytest.raises(InvalidToolArgs, match=r"ctx: Extra inputs are not permitted"):
        send_message.validate({"to": "bob", "ctx": {"run_id": "x", "step_index": 0}})


def test_invoke_passes_the_context_to_the_annotated_parameter() -> None:
    kwargs = send_message.validate({"to": "bob", "body": "yo"})
    result = send_message.invoke(kwargs, CTX)
    assert result == {"to": "bob", "body": "yo", "key": "run:3", "attempt": 1}


def test_invoke_does_not_mutate_the_validated_arguments() -> None:
    kwargs = send_message.validate({"to": "bob"})
    send_message.invoke(kwargs, CTX)
    assert kwargs == {"to": "bob", "body": "hi"}


def test_invoke_without_a_context_parameter_does_not_pass_one() -> None:
    assert add.invoke(add.validate({"a": 1}), CTX) == 3


# -- results -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [None, True, 1, 1.5, "text", [1, "a", None], {"k": {"nested": [1, 2]}}]
)
def test_json_results_are_returned_unchanged(value: Any) -> None:
    assert returns.invoke({"value": value}, CTX) == value


@pytest.mark.parametrize(
    ("value", "type_name"), [({1, 2}, "set"), (object(), "object"), (b"raw", "bytes")]
)
def test_non_json_result_is_a_tool_result_error(value: Any, type_name: str) -> None:
    with pytest.raises(ToolResultError) as info:
        returns.invoke({"value": value}, CTX)
    message = str(info.value)
    assert "tool 'returns'" in message
    assert "not JSON-serialisable" in message
    assert f"({type_name})" in message


def test_exceptions_from_the_tool_propagate_unchanged() -> None:
    @harness.tool
    def boom() -> None:
        raise RuntimeError("downstream is down")

    with pytest.raises(RuntimeError, match="downstream is down"):
        boom.invoke({}, CTX)


# -- agents --------------------------------------------------------------------


def test_agent_looks_tools_up_by_name() -> None:
    agent = Agent(name="a", model=_model(), tools=[add, send_message])
    assert agent.tool("add") is add
    assert agent.tool("send") is send_message


def test_unknown_tool_lists_the_offered_tools() -> None:
    agent = Agent(name="helper", model=_model(), tools=[send_message, add])
    with pytest.raises(UnknownTool) as info:
        agent.tool("delete_everything")
    message = str(info.value)
    assert "'delete_everything'" in message
    assert "'helper'" in message
    assert "add, send" in message


def test_unknown_tool_on_an_agent_without_tools() -> None:
    agent = Agent(name="bare", model=_model())
    with pytest.raises(UnknownTool, match="no tools"):
        agent.tool("add")


def test_a_plain_function_in_tools_is_a_type_error() -> None:
    def plain(x: int) -> int:
        return x

    with pytest.raises(TypeError, match=r"not a tool; decorate it with @harness.tool"):
        Agent(name="a", model=_model(), tools=[add, plain])  # type: ignore[list-item]


@pytest.mark.parametrize("max_steps", [0, -1])
def test_max_steps_below_one_is_a_value_error(max_steps: int) -> None:
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        Agent(name="a", model=_model(), max_steps=max_steps)


def test_max_steps_of_one_is_allowed() -> None:
    assert Agent(name="a", model=_model(), max_steps=1).max_steps == 1


@pytest.mark.parametrize("policy", ["continue", "fail"])
def test_on_tool_error_policies(policy: str) -> None:
    assert Agent(name="a", model=_model(), on_tool_error=policy).on_tool_error == policy


def test_bad_on_tool_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="on_tool_error must be 'continue' or 'fail'"):
        Agent(name="a", model=_model(), on_tool_error="retry")


def test_register_and_get_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "_AGENTS", {})
    agent = Agent(name="alpha", model=_model(), tools=[add])
    assert register_agent(agent) is agent
    assert get_agent("alpha") is agent
    assert harness.register_agent is register_agent


def test_last_registration_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "_AGENTS", {})
    register_agent(Agent(name="alpha", model=_model()))
    second = register_agent(Agent(name="alpha", model=_model(), max_steps=3))
    assert get_agent("alpha") is second


def test_agent_not_found_lists_registered_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "_AGENTS", {})
    register_agent(Agent(name="zeta", model=_model()))
    register_agent(Agent(name="alpha", model=_model()))
    with pytest.raises(AgentNotFound) as info:
        get_agent("gamma")
    assert str(info.value) == "no agent named 'gamma'; registered agents: alpha, zeta"
    assert info.value.name == "gamma"


def test_agent_not_found_with_nothing_registered_hints_at_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agents, "_AGENTS", {})
    with pytest.raises(AgentNotFound, match=r"registered agents: none \(set HARNESS_IMPORTS\)"):
        get_agent("gamma")
