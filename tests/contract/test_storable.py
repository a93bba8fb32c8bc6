"""Text and JSON a column cannot hold, from a tool or a model: the outcome is
recorded once, on every backend (harness.inputs, at the store's boundary).

Before the boundary, a NUL in a tool's error (PostgreSQL) or a lone surrogate
(SQLite) could never be checkpointed: the write failed, the step was retried,
the tool called again, and the run failed "interrupted" with the real error lost.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text, update

import harness
from harness.engine.creation import create_run
from harness.errors import BadInput
from harness.inputs import MAX_DEPTH, REPLACEMENT, checked_json
from harness.records import RunStatus, StepStatus
from harness.store import schema
from harness.store.sql import SQLStore
from tests.rig import Rig

HARNESS = str(Path(sys.executable).with_name("harness"))
calls: list[str] = []
UGLY = "bad\x00thing \ud800 end"
STORED = f"bad{REPLACEMENT}thing {REPLACEMENT} end"


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


@harness.tool(effect="idempotent")
def ugly_error() -> str:
    calls.append("ugly_error")
    raise harness.ToolError(UGLY)


@harness.tool(effect="at_most_once")
def ugly_once() -> str:
    calls.append("ugly_once")
    raise RuntimeError(UGLY)


@harness.tool(effect="idempotent")
def ugly_result() -> dict[str, Any]:
    calls.append("ugly_result")
    return {"text": UGLY, "key\ud800": 1}


@harness.tool(effect="idempotent")
def deep_result() -> Any:
    calls.append("deep_result")
    return _deep(MAX_DEPTH + 5)


@harness.tool(effect="idempotent")
def nan_result() -> Any:
    calls.append("nan_result")
    return {"x": math.nan}


@harness.tool(effect="read_only")
def echo(x: Any = None) -> Any:
    calls.append("echo")
    return x


def _agent(name: str, turns: list[dict[str, Any]], tools: list[Any], **kw: Any) -> str:
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=tools, **kw)
    )
    return name


def _calling(tool: Any, args: Any = None) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": tool.name, "args": args or {}}]}, {"final": "done"}]


ERR = _agent("s-error", _calling(ugly_error), [ugly_error])
ONCE = _agent("s-once", _calling(ugly_once), [ugly_once])
ERR_FAIL = _agent("s-error-fail", _calling(ugly_error), [ugly_error], on_tool_error="fail")
RESULT = _agent("s-result", _calling(ugly_result), [ugly_result])
DEEP = _agent("s-deep", _calling(deep_result), [deep_result])
NAN = _agent("s-nan", _calling(nan_result), [nan_result])
FINAL = _agent("s-final", [{"final": UGLY}], [])
NAN_ARGS = _agent("s-nan-args", _calling(echo, {"x": math.nan}), [echo])
DEEP_ARGS = _agent("s-deep-args", _calling(echo, {"x": _deep(MAX_DEPTH + 1)}), [echo])
UGLY_ARGS = _agent("s-ugly-args", _calling(echo, {"x": UGLY}), [echo])


@pytest.fixture
def rig(store: SQLStore) -> Iterator[Rig]:
    calls.clear()
    yield Rig(store)


def _run(rig: Rig, agent: str) -> tuple[Any, list[Any]]:
    run_id = create_run(rig.runtime(), agent, "goal")
    rig.drive()
    return rig.load(run_id), rig.store.steps(run_id)


def test_a_tool_error_nobody_can_store_is_recorded_once(rig: Rig) -> None:
    run, steps = _run(rig, ERR)
    assert run.status is RunStatus.COMPLETED, run
    assert calls == ["ugly_error"]
    assert steps[1].status is StepStatus.FAILED
    assert steps[1].error == STORED
    assert steps[1].attempts == 1


def test_an_at_most_once_tool_that_failed_is_failed_not_in_doubt(rig: Rig) -> None:
    run, steps = _run(rig, ONCE)
    assert calls == ["ugly_once"]
    assert steps[1].status is StepStatus.FAILED, steps[1]
    assert STORED in (steps[1].error or "")
    assert run.status is RunStatus.COMPLETED


def test_the_run_error_of_a_failing_tool_is_stored(rig: Rig) -> None:
    run, _ = _run(rig, ERR_FAIL)
    assert run.status is RunStatus.FAILED
    assert STORED in (run.error or "")
    assert calls == ["ugly_error"]
    events = rig.store.events(run.run_id)
    assert any(STORED in (e.detail or "") for e in events)


def test_a_final_answer_with_a_nul_completes_the_run(rig: Rig) -> None:
    run, steps = _run(rig, FINAL)
    assert run.status is RunStatus.COMPLETED, run
    assert run.result == STORED
    # The step keeps the model's response as JSON: a NUL is escaped, kept.
    assert steps[0].result["final"] == UGLY.replace("\ud800", REPLACEMENT)


def test_a_result_with_lone_surrogates_is_stored_readable(rig: Rig) -> None:
    run, steps = _run(rig, RESULT)
    assert run.status is RunStatus.COMPLETED
    assert steps[1].result == {"text": UGLY.replace("\ud800", REPLACEMENT), f"key{REPLACEMENT}": 1}
    assert calls == ["ugly_result"]


@pytest.mark.parametrize(
    ("agent", "problem"),
    [(DEEP, f"nested deeper than {MAX_DEPTH} levels"), (NAN, "nan is not a JSON number")],
)
def test_a_result_no_reader_could_read_is_the_tools_error(
    rig: Rig, agent: str, problem: str
) -> None:
    run, steps = _run(rig, agent)
    assert run.status is RunStatus.COMPLETED
    assert steps[1].status is StepStatus.FAILED
    assert problem in (steps[1].error or ""), steps[1].error
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("agent", "problem"),
    [(NAN_ARGS, "nan is not a JSON number"), (DEEP_ARGS, "nested deeper than")],
)
def test_model_arguments_that_are_not_json_are_an_error_the_model_sees(
    rig: Rig, agent: str, problem: str
) -> None:
    run, steps = _run(rig, agent)
    assert run.status is RunStatus.COMPLETED
    assert calls == []  # never called with them
    assert steps[1].status is StepStatus.FAILED
    assert problem in (steps[1].error or ""), steps[1].error
    # Nothing stored is NaN or too deep: what the model sent is kept as text.
    for step in steps:
        json.dumps([step.args, step.result], allow_nan=False)
    assert isinstance(steps[1].args["_raw_arguments"], str)


def test_model_arguments_with_lone_surrogates_are_made_storable(rig: Rig) -> None:
    run, steps = _run(rig, UGLY_ARGS)
    assert run.status is RunStatus.COMPLETED
    assert steps[1].args == {"x": UGLY.replace("\ud800", REPLACEMENT)}
    assert steps[1].result == UGLY.replace("\ud800", REPLACEMENT)


def test_a_value_stored_before_the_rules_is_still_readable(rig: Rig, sql_store: SQLStore) -> None:
    """Rows written by an older release (or by hand) hold what the doors now refuse."""
    run, _ = _run(rig, RESULT)
    deep = "[" * 300 + "]" * 300
    with sql_store.engine.begin() as conn:
        conn.execute(
            update(schema.steps)
            .where(schema.steps.c.run_id == run.run_id, schema.steps.c.idx == 1)
            .values(result=deep, args='{"x": NaN}')
        )
    from harness.inputs import render_json

    steps = sql_store.steps(run.run_id)
    rendered = render_json([s.to_dict() for s in steps])
    assert "nested deeper than" in rendered
    assert "NaN" not in rendered
    with sql_store.engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1


def test_a_checkpoint_of_unstorable_text_is_recognised_as_landed(rig: Rig) -> None:
    """A result checkpoint whose reply was lost is found landed by comparing the
    run as stored with what it wrote: as the store wrote it, text made storable."""
    from harness.engine import checkpointing, transitions

    run_id = create_run(rig.runtime(), FINAL, "goal")
    run = rig.load(run_id)
    checkpoint = transitions.fail(run, UGLY, worker="w1", now=rig.clock.now())
    rig.store.checkpoint(checkpoint)
    assert rig.load(run_id).error == STORED
    assert checkpointing.landed(rig.runtime(), checkpoint)


def test_no_stored_value_makes_a_read_fail(rig: Rig, sql_store: SQLStore, monkeypatch: Any) -> None:
    """Rows written by an older release, or by hand, may hold what the doors now
    refuse: the API, ``show --json`` and an export still read them."""
    from starlette.testclient import TestClient

    from harness import api
    from harness.web.app import create_app

    run, _ = _run(rig, RESULT)
    deep = "[" * 300 + "]" * 300
    with sql_store.engine.begin() as conn:
        conn.execute(
            update(schema.steps)
            .where(schema.steps.c.run_id == run.run_id, schema.steps.c.idx == 1)
            .values(result=deep, args='{"x": NaN, "y": "\\ud800"}')
        )
    monkeypatch.setenv("HARNESS_DATABASE_URL", str(sql_store.engine.url.render_as_string(False)))
    api.reset_runtime()
    headers = {"Authorization": "Bearer t"}
    with TestClient(create_app("t"), raise_server_exceptions=False) as client:
        for path in (f"/api/runs/{run.run_id}", f"/api/runs/{run.run_id}/steps"):
            answer = client.get(path, headers=headers)
            assert answer.status_code == 200, answer.text
            assert "NaN" not in answer.text
            assert "\\ud800" not in answer.text
    shown = subprocess.run(
        [HARNESS, "show", run.run_id, "--json"], capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    _strict_json(shown.stdout)
    exported = subprocess.run(
        [HARNESS, "export", run.run_id], capture_output=True, text=True, check=False
    )
    assert exported.returncode == 0, exported.stderr
    _strict_json(exported.stdout)


def _strict_json(text: str) -> Any:
    """JSON as RFC 8259 has it: Python's own parser also takes NaN and Infinity."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@harness.tool(effect="at_most_once")
def pay_and_tell() -> dict[str, Any]:
    calls.append("pay_and_tell")
    return {"items": ("a", "b"), "by_day": {1: 5, None: 0}}


TUPLES = _agent("s-tuples", _calling(pay_and_tell), [pay_and_tell])


def test_what_json_dumps_writes_is_a_result_as_it_writes_it(rig: Rig) -> None:
    """A tuple is a list and a number key its text, as json.dumps has them:
    a result of a call that acted is never thrown away for its Python types."""
    _, steps = _run(rig, TUPLES)
    assert calls == ["pay_and_tell"]
    assert steps[1].status is StepStatus.DONE
    assert steps[1].result == {"items": ["a", "b"], "by_day": {"1": 5, "null": 0}}


def test_a_refused_result_says_the_call_was_made(rig: Rig) -> None:
    _, steps = _run(rig, NAN)
    assert "the call was made, but its result cannot be kept" in (steps[1].error or "")


def test_a_refusal_names_a_key_with_control_characters_on_one_line() -> None:
    with pytest.raises(BadInput) as refused:
        checked_json({"a\nb\x00": {"\r": 10**1001}}, "result")
    assert "\n" not in str(refused.value) and "\r" not in str(refused.value)
    assert "a\\nb\\x00" in str(refused.value)
