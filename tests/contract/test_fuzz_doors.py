"""Hostile text and JSON through every door, on every backend (hypothesis).

Each case must end in a clear error or a stored, readable value: never an
exception out of the engine, a lost outcome, a second call of a tool, or a
stored value that a reader (the API's JSON, ``show --json``) cannot write.
The doors: a tool's result and its error, a model's final answer and its
tool-call arguments (harness.inputs), an operator's values (a result, edited
arguments, a reason, a goal: harness.api.Operator), the answers to a
deferred call (a completion, a signal's name, id and data, a callback's
body) and an imported archive.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import harness
from harness import api, callbacks
from harness.engine.creation import create_run
from harness.errors import BadArchive, BadInput, DecisionConflict, InvalidToolArgs
from harness.inputs import MAX_DEPTH, checked_json, render_json
from harness.records import RunStatus, StepStatus
from harness.runs import archive
from harness.store.sql import SQLStore
from tests.rig import Rig
from tests.unit.test_cli_waits import waiting
from tests.unit.test_operator_door import awaiting_run, in_doubt_run

#: Text no column holds as it is, text that is merely large, and ordinary text.
HOSTILE_TEXT = st.one_of(
    st.text(alphabet=st.sampled_from(["\x00", "\ud800", "\udfff", "a", "é", "\U0001f600"])),
    st.text(),
    st.builds(lambda n, c: c * n, st.integers(60_000, 70_000), st.sampled_from(["x", "\x00"])),
)


def _nested(depth: int, leaf: Any) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"k": leaf}
    return leaf


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**999, max_value=10**1200),
    st.floats(allow_nan=True, allow_infinity=True),
    HOSTILE_TEXT,
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(HOSTILE_TEXT, inner, max_size=4)


HOSTILE_JSON = st.one_of(
    st.recursive(LEAVES, _containers, max_leaves=20),
    st.builds(_nested, st.integers(MAX_DEPTH - 2, 1_000), LEAVES),
)
FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
TEN_MB = "\x00" * (10 << 20)
DEEP = _nested(1_000, "bottom")

calls: list[str] = []
hostile: dict[str, Any] = {}


@harness.tool(effect="idempotent")
def give() -> Any:
    calls.append("give")
    return hostile["value"]


@harness.tool(effect="at_most_once")
def fail() -> Any:
    calls.append("fail")
    raise RuntimeError(hostile["value"])


@harness.tool(effect="read_only")
def take(x: Any = None) -> Any:
    calls.append("take")
    return "took it"


def _calling(tool: Any) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": tool.name, "args": {}}]}, {"final": "done"}]


for _tool in (give, fail):
    harness.register_agent(
        harness.Agent(
            name=f"fuzz-{_tool.name}", model=harness.ScriptedModel(_calling(_tool)), tools=[_tool]
        )
    )


@pytest.fixture
def rig(store: SQLStore) -> Iterator[Rig]:
    yield Rig(store)


def _readable(rig: Rig, run_id: str) -> list[Any]:
    """Every stored step, as a reader writes it: strict JSON, or the test fails."""
    steps = [s.to_dict() for s in rig.store.steps(run_id)]
    for step in steps:  # nothing stored that a door refuses (too deep, NaN); a model
        for value in (step["args"], step["result"], step.get("approval")):  # step's result
            checked_json(value, "stored", max_depth=MAX_DEPTH + 3)  # wraps the arguments
    text = render_json({"run": rig.load(run_id).to_dict(), "steps": steps})
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a reader's JSON"))
    return steps


def _drive(rig: Rig, agent: str) -> str:
    calls.clear()
    run_id = create_run(rig.runtime(), agent, "goal")
    rig.drive()
    return run_id


@FUZZ
@given(value=HOSTILE_JSON)
@example(value=TEN_MB)
@example(value=DEEP)
@example(value={"x": math.nan})
@example(value=10**5000)
def test_a_tool_result_is_stored_readable_or_is_the_tools_error(rig: Rig, value: Any) -> None:
    hostile["value"] = value
    run_id = _drive(rig, "fuzz-give")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert calls == ["give"]
    step = rig.store.steps(run_id)[1]
    if step.status is StepStatus.FAILED:
        assert "not JSON-serialisable" in (step.error or ""), step.error
    else:
        assert step.status is StepStatus.DONE
    _readable(rig, run_id)


@FUZZ
@given(text=HOSTILE_TEXT)
@example(text=TEN_MB)
def test_a_tool_error_is_recorded_once(rig: Rig, text: str) -> None:
    hostile["value"] = text
    run_id = _drive(rig, "fuzz-fail")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert calls == ["fail"]  # an at_most_once tool: a failing write would have left it in doubt
    assert rig.store.steps(run_id)[1].status is StepStatus.FAILED
    _readable(rig, run_id)


_agents: dict[str, int] = {}


def _scripted(turns: list[dict[str, Any]], tools: list[Any]) -> str:
    name = f"fuzz-scripted-{len(_agents)}"
    _agents[name] = 1
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=tools)
    )
    return name


@FUZZ
@given(text=HOSTILE_TEXT)
@example(text=TEN_MB)
def test_a_final_answer_completes_the_run_whatever_it_says(rig: Rig, text: str) -> None:
    run_id = _drive(rig, _scripted([{"final": text}], []))
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED
    assert run.result is not None and len(run.result) == len(text)
    _readable(rig, run_id)


@FUZZ
@given(value=HOSTILE_JSON)
@example(value=DEEP)
@example(value=math.inf)
def test_model_arguments_are_used_or_answered_with_an_error(rig: Rig, value: Any) -> None:
    turns = [{"tool_calls": [{"name": "take", "args": {"x": value}}]}, {"final": "ok"}]
    run_id = _drive(rig, _scripted(turns, [take]))
    assert rig.load(run_id).status is RunStatus.COMPLETED
    step = rig.store.steps(run_id)[1]
    if step.status is StepStatus.FAILED:
        assert calls == [] and "arguments for tool 'take'" in (step.error or ""), step.error
    else:
        assert calls == ["take"] and step.result == "took it"
    _readable(rig, run_id)


# -- the operator's and the archive's doors -------------------------------------------


@pytest.fixture
def operator_store(
    store: SQLStore, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> Iterator[SQLStore]:
    """The public API (harness.api.Operator, the operator's one door) on ``store``."""
    monkeypatch.setenv("HARNESS_DATABASE_URL", database_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_TEST_LEDGER", str(tmp_path / "ledger.txt"))
    api.reset_runtime()
    yield store
    api.reset_runtime()


def _refused_or_readable(action: Any, run_id: str, store: SQLStore) -> None:
    """``action`` is refused naming a field, or its values are stored readable."""
    try:
        action()
    except BadInput as err:
        assert err.field and str(err).startswith(f"{err.field}: ")
    except (DecisionConflict, InvalidToolArgs):
        pass  # the run had moved on, or the tool refuses them: nothing changed, and it says so
    _readable(Rig(store), run_id)


@FUZZ
@given(value=HOSTILE_JSON)
@example(value=DEEP)
@example(value=_nested(600, 1))
@example(value=math.nan)
def test_a_resolved_result_is_refused_or_stored_readable(
    operator_store: SQLStore, value: Any
) -> None:
    run_id = in_doubt_run()
    _refused_or_readable(
        lambda: harness.resolve_run(run_id, "succeeded", value), run_id, operator_store
    )


@FUZZ
@given(value=HOSTILE_JSON, text=HOSTILE_TEXT)
@example(value={"amount": math.nan}, text="ok")
@example(value=DEEP, text="\x00")
def test_edited_arguments_and_reasons_are_refused_or_stored_readable(
    operator_store: SQLStore, value: Any, text: str
) -> None:
    run_id = awaiting_run()
    _refused_or_readable(
        lambda: harness.approve(run_id, args={"amount": value}), run_id, operator_store
    )
    _refused_or_readable(lambda: harness.reject(run_id, text, step=2), run_id, operator_store)
    _refused_or_readable(lambda: harness.cancel_run(run_id, text), run_id, operator_store)


@FUZZ
@given(text=HOSTILE_TEXT)
@example(text="a \x00 goal")
@example(text=TEN_MB)
def test_a_goal_is_refused_or_stored_as_given(operator_store: SQLStore, text: str) -> None:
    try:
        run_id = harness.start_run("chain", text)
    except BadInput as err:
        assert err.field == "goal"
        return
    assert harness.get_run(run_id).goal == text


@FUZZ
@given(value=HOSTILE_JSON, text=HOSTILE_TEXT)
@example(value=DEEP, text="ok")
@example(value={"x": math.nan}, text="\x00")
@example(value=10**999, text="\ud800")
def test_an_archive_is_refused_or_imported_readable(
    operator_store: SQLStore, value: Any, text: str
) -> None:
    run_id = harness.start_run("chain", "exported")
    rig = Rig(operator_store)
    rig.sent.append((run_id, 0))
    rig.drive()
    document = archive.export_run(operator_store, run_id)
    operator_store.reset()
    document["run"]["goal"] = text
    document["steps"][-1]["result"] = value
    try:
        document["manifest"]["sha256"] = archive.content_hash(document)
    except ValueError:  # no JSON writer takes it (a 5,000-digit integer): no forger either
        assume(False)
    try:
        archive.import_run(operator_store, document)
    except BadArchive as err:
        assert "\n" not in str(err)
        return
    _readable(rig, run_id)


# -- the answers to runs that wait on the world ---------------------------------------

SECRET = "f" * 32


@pytest.fixture
def waits_store(operator_store: SQLStore, monkeypatch: pytest.MonkeyPatch) -> SQLStore:
    """:func:`operator_store` with the agents that defer, and a callback secret."""
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents,tests.door_wait_agents")
    monkeypatch.setenv("HARNESS_CALLBACK_SECRET", SECRET)
    api.reset_runtime()
    return operator_store


def _answered_or_untouched(action: Any, run_id: str, store: SQLStore) -> None:
    """``action`` is refused naming a field, writing nothing (the call still
    deferred, no signal kept, the run as it was), or what it wrote is readable."""
    before = store.load(run_id)
    try:
        action()
    except BadInput as err:
        assert err.field and str(err).startswith(f"{err.field}: ") and "\n" not in str(err)
        assert store.load(run_id) == before
        assert store.steps(run_id, 1, 1)[0].status is StepStatus.DEFERRED
        assert store.kept_signals(run_id) == []
        return
    _readable(Rig(store), run_id)
    kept = [k.to_dict() for k in store.kept_signals(run_id)]
    json.loads(render_json(kept), parse_constant=lambda c: pytest.fail(f"{c} kept"))


@FUZZ
@given(name=HOSTILE_TEXT, signal_id=st.none() | HOSTILE_TEXT, data=HOSTILE_JSON)
@example(name="paid\x00", signal_id=None, data=1)
@example(name="paid", signal_id="\ud800", data=1)
@example(name="paid", signal_id=None, data=DEEP)
@example(name="paid", signal_id=None, data={"amount": math.nan})
@example(name="x" * 70_000, signal_id=None, data=None)
@example(name="paid", signal_id="i" * 70_000, data=None)
def test_a_signal_is_refused_writing_nothing_or_kept_readable(
    waits_store: SQLStore, name: str, signal_id: str | None, data: Any
) -> None:
    run_id = waiting("d-payer")
    _answered_or_untouched(
        lambda: harness.signal(run_id, name, data, signal_id=signal_id), run_id, waits_store
    )


@FUZZ
@given(text=HOSTILE_TEXT, message_id=st.none() | HOSTILE_TEXT)
@example(text="go on\x00", message_id=None)
@example(text="go on", message_id="\ud800")
@example(text=TEN_MB, message_id=None)
@example(text=" ", message_id=None)
@example(text="go on", message_id="i" * 70_000)
def test_a_users_message_is_refused_writing_nothing_or_kept_readable(
    waits_store: SQLStore, text: str, message_id: str | None
) -> None:
    run_id = waiting("d-payer")
    _answered_or_untouched(
        lambda: harness.send_message(run_id, text, message_id=message_id), run_id, waits_store
    )


@FUZZ
@given(value=HOSTILE_JSON, text=HOSTILE_TEXT)
@example(value=DEEP, text="\x00")
@example(value=_nested(600, 1), text="\ud800")
@example(value=math.nan, text=TEN_MB)
@example(value=TEN_MB, text="ok")
def test_a_completion_is_refused_writing_nothing_or_stored_readable(
    waits_store: SQLStore, value: Any, text: str
) -> None:
    run_id = waiting("d-payer")
    _answered_or_untouched(
        lambda: harness.complete_step(run_id, 1, result=value), run_id, waits_store
    )
    run_id = waiting("d-payer")
    _answered_or_untouched(
        lambda: harness.complete_step(run_id, 1, error=text), run_id, waits_store
    )
    run_id = waiting("d-payer")
    _answered_or_untouched(lambda: harness.complete_step(run_id, 1, by=text), run_id, waits_store)


@FUZZ
@given(body=HOSTILE_JSON | st.builds(lambda t: {"error": t}, HOSTILE_TEXT))
@example(body=DEEP)
@example(body={"error": "\x00"})
@example(body={"error": math.nan})
@example(body=[math.inf])
def test_a_callback_body_is_refused_writing_nothing_or_stored_readable(
    waits_store: SQLStore, body: Any
) -> None:
    run_id = waiting("d-shipper")
    rt = api.runtime()
    claim = callbacks.CallbackClaim(run_id, 1, 1, rt.clock.now() + 60)
    token = callbacks.sign(SECRET, claim)
    _answered_or_untouched(lambda: api.answer_callback(token, body), run_id, waits_store)
