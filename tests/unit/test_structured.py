"""Structured answers, ``Agent(output_type=..., output_retries=...)``, on a
scripted model: a valid answer is the run's result as a JSON object; an
invalid one goes back to the model with its error, a recorded step like any
other, until ``output_retries`` are spent and the run fails with the error.
Through the providers' SDKs: tests/unit/test_structured_providers.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field, field_validator

import harness
from harness import api, catalog
from harness.agents import register_agent
from harness.cli import main
from harness.engine.creation import create_run
from harness.output import FINAL_TOOL, output_schema, shown_result
from harness.reads import Reads
from harness.records import RunStatus, StepKind, StepStatus
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from harness.web.app import create_app
from tests.rig import Rig


class Forecast(BaseModel):
    """What to wear in a city."""

    city: str
    celsius: int
    wear: list[str] = []

    @field_validator("celsius")
    @classmethod
    def earthly(cls, value: int) -> int:
        if not -90 <= value <= 60:
            raise ValueError("no such temperature on Earth")
        return value


OSLO = {"city": "Oslo", "celsius": -3, "wear": ["coat", "hat"]}


def structured(name: str, turns: list[dict[str, Any]], **options: Any) -> harness.Agent:
    return register_agent(
        harness.Agent(
            name=name, model=harness.ScriptedModel(turns), output_type=Forecast, **options
        )
    )


def drive(rig: Rig, agent: str, goal: str = "what to wear in Oslo") -> str:
    run_id = create_run(rig.runtime(), agent, goal)
    rig.drive()
    return run_id


@pytest.fixture
def rig(memory_store: Any) -> Rig:
    return Rig(memory_store)


def test_a_valid_answer_is_the_runs_result_as_a_json_object(rig: Rig) -> None:
    structured("wear-valid", [{"final": {"city": "Oslo", "celsius": -3}}])
    run_id = drive(rig, "wear-valid")

    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    # The column holds the JSON text, defaults filled in; the reads decode it.
    assert json.loads(run.result or "") == {"city": "Oslo", "celsius": -3, "wear": []}
    (step,) = rig.store.steps(run_id)
    assert step.result == {"final": {"city": "Oslo", "celsius": -3, "wear": []}}
    reads = Reads(rig.store, rig.clock, running_alert=900.0)
    assert reads.run_detail(run_id).to_dict()["result"] == {
        "city": "Oslo",
        "celsius": -3,
        "wear": [],
    }
    assert reads.listed(run)["result"] == {"city": "Oslo", "celsius": -3, "wear": []}


def test_an_answer_in_text_is_parsed_as_json_even_in_a_code_fence(rig: Rig) -> None:
    fenced = "```json\n" + json.dumps(OSLO) + "\n```"
    structured("wear-text", [{"final": fenced}])
    run = rig.load(drive(rig, "wear-text"))
    assert run.status is RunStatus.COMPLETED, run.error
    assert json.loads(run.result or "") == OSLO


def test_an_invalid_answer_goes_back_to_the_model_then_a_valid_one_completes(rig: Rig) -> None:
    structured(
        "wear-retry",
        [{"final": {"city": "Oslo", "celsius": 300}}, {"final": OSLO}],
    )
    run_id = drive(rig, "wear-retry")

    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    first, second = rig.store.steps(run_id)
    assert (first.kind, first.status, second.kind) == (StepKind.MODEL, StepStatus.DONE, "model")
    # The invalid answer is recorded as given, with the error the model is told.
    assert first.result["final"] == {"city": "Oslo", "celsius": 300}
    assert first.result["invalid"] == (
        "1 validation error for Forecast: celsius: Value error, no such temperature on "
        "Earth (given 300)"
    )
    # The retry is a step like any other, and counts the invalid answers before it.
    assert second.args == {"turn": 1, "invalid_answers": 1}
    assert second.result == {"final": OSLO}
    assert json.loads(run.result or "") == OSLO
    details = [e.detail for e in rig.store.events_after(run_id, None, 100) if e.step_index == 0]
    assert "invalid final answer, asked again (1 of 2)" in details


def test_invalid_answers_past_output_retries_fail_the_run_with_the_error(rig: Rig) -> None:
    missing = {"city": "Oslo"}
    structured("wear-fail", [{"final": missing}] * 3, output_retries=1)
    run_id = drive(rig, "wear-fail")

    run = rig.load(run_id)
    assert run.status is RunStatus.FAILED
    assert run.error == (
        "model step 1: the final answer is invalid after 1 retry: "
        "1 validation error for Forecast: celsius: Field required"
    )
    steps = rig.store.steps(run_id)
    assert [s.status for s in steps] == [StepStatus.DONE, StepStatus.FAILED]
    assert steps[1].result == {"final": missing, "invalid": steps[0].result["invalid"]}


def test_no_retries_fails_at_the_first_invalid_answer(rig: Rig) -> None:
    structured("wear-strict", [{"final": "it is cold"}, {"final": OSLO}], output_retries=0)
    run = rig.load(drive(rig, "wear-strict"))
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert run.error.startswith("model step 0: the final answer is invalid: 1 validation error")
    assert "Invalid JSON" in run.error


def test_tool_calls_between_invalid_answers_do_not_reset_their_count(rig: Rig) -> None:
    @harness.tool(effect="read_only")
    def thermometer(city: str) -> int:
        """The temperature in a city."""
        return -3

    structured(
        "wear-tools",
        [
            {"final": {"city": "Oslo"}},
            {"tool_calls": [{"name": "thermometer", "args": {"city": "Oslo"}}]},
            {"final": {"city": "Oslo"}},
            {"final": OSLO},
        ],
        tools=[thermometer],
        output_retries=1,
    )
    run = rig.load(drive(rig, "wear-tools"))
    assert run.status is RunStatus.FAILED
    assert run.error is not None and "after 1 retry" in run.error


def test_a_scripted_object_answer_without_an_output_type_is_an_object(rig: Rig) -> None:
    register_agent(
        harness.Agent(name="plain-object", model=harness.ScriptedModel([{"final": {"a": [1]}}]))
    )
    run_id = drive(rig, "plain-object")
    assert Reads(rig.store, rig.clock, running_alert=900.0).run_detail(run_id).to_dict()[
        "result"
    ] == {"a": [1]}


def test_a_text_answer_that_looks_like_json_stays_text(rig: Rig) -> None:
    register_agent(
        harness.Agent(name="plain-text", model=harness.ScriptedModel([{"final": '{"a": 1}'}]))
    )
    run_id = drive(rig, "plain-text")
    reads = Reads(rig.store, rig.clock, running_alert=900.0)
    assert reads.run_detail(run_id).to_dict()["result"] == '{"a": 1}'
    assert reads.listed(rig.load(run_id))["result"] == '{"a": 1}'


def test_the_agent_refuses_what_is_no_output_type() -> None:
    model = harness.ScriptedModel([{"final": "x"}])
    with pytest.raises(TypeError, match="output_type must be a pydantic model class"):
        harness.Agent(name="bad", model=model, output_type=dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="output_retries must be 0 or more"):
        harness.Agent(name="bad", model=model, output_type=Forecast, output_retries=-1)

    @harness.tool(name=FINAL_TOOL, effect="read_only")
    def clash() -> str:
        """A tool with the final answer's name."""
        return ""

    with pytest.raises(ValueError, match="rename the tool"):
        harness.Agent(name="bad", model=model, output_type=Forecast, tools=[clash])
    harness.Agent(name="fine", model=model, tools=[clash])  # no output type: no clash


def test_a_scripted_final_object_must_be_storable() -> None:
    with pytest.raises(harness.ModelError, match="'final' is not storable JSON"):
        harness.ScriptedModel([{"final": {"x": float("nan")}}])


def test_the_schema_is_made_strict_when_it_can_be() -> None:
    schema = output_schema(Forecast)
    assert (schema.name, schema.description, schema.strict) == (
        "Forecast",
        "What to wear in a city.",
        True,
    )
    assert schema.schema["additionalProperties"] is False
    assert schema.schema["required"] == ["city", "celsius", "wear"]
    assert "default" not in schema.schema["properties"]["wear"]  # type: ignore[index,operator]

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        name: str

    class Counts(BaseModel):
        by_city: dict[str, int] = Field(default_factory=dict)

    for loose in (Open, Counts):
        kept = output_schema(loose)
        assert kept.strict is False
        assert kept.schema == loose.model_json_schema()


def test_the_output_type_is_part_of_the_definition_hash() -> None:
    class Other(BaseModel):
        city: str

    model = harness.ScriptedModel([{"final": "x"}])
    one = harness.Agent(name="h", model=model, output_type=Forecast)
    other = harness.Agent(name="h", model=model, output_type=Other)
    limits = catalog.definition(one)["limits"]
    assert isinstance(limits, dict) and limits["output_type"] == Forecast.model_json_schema()
    assert catalog.definition_hash(one) != catalog.definition_hash(other)


def test_show_json_and_the_api_give_the_result_as_an_object(
    monkeypatch: pytest.MonkeyPatch, sqlite_store: SQLStore, sqlite_url: str, tmp_path: Path
) -> None:
    rig = Rig(sqlite_store)
    structured("wear-shown", [{"final": {"city": "Oslo", "celsius": 300}}, {"final": OSLO}])
    run_id = drive(rig, "wear-shown")
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))

    shown = CliRunner().invoke(main, ["show", run_id, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["result"] == OSLO
    listed = CliRunner().invoke(main, ["list", "--json"])
    assert [r["result"] for r in json.loads(listed.stdout)] == [OSLO]
    waited = CliRunner().invoke(main, ["wait", run_id, "--json"])
    assert json.loads(waited.stdout)["result"] == OSLO
    text = CliRunner().invoke(main, ["show", run_id])
    assert f"result: {json.dumps(OSLO)}" in text.stdout

    with TestClient(create_app("s3cret")) as client:
        auth = {"Authorization": "Bearer s3cret"}
        detail = client.get(f"/api/runs/{run_id}", headers=auth).json()
        header = client.get(f"/api/runs/{run_id}?steps=false", headers=auth).json()
        page = client.get("/api/runs", headers=auth).json()
    api.reset_runtime()
    assert detail["result"] == header["result"] == page["runs"][0]["result"] == OSLO
    assert detail["steps"][0]["result"]["invalid"].startswith("1 validation error")


def test_shown_result_needs_the_final_step_to_say_structured(rig: Rig) -> None:
    register_agent(harness.Agent(name="shown", model=harness.ScriptedModel([{"final": {"a": 1}}])))
    run_id = drive(rig, "shown")
    run = rig.load(run_id)
    (step,) = rig.store.steps(run_id)
    assert shown_result(run, step) == {"a": 1}
    assert shown_result(run, None) == run.result


def test_a_users_message_between_invalid_answers_does_not_reset_their_count(
    memory_store: MemoryStore,
) -> None:
    """A message is not a valid answer: the turn after it keeps the count, so
    the run still fails after ``output_retries`` retries, each billed once."""
    from harness.engine import conversation

    class Forecast(BaseModel):
        city: str
        celsius: int

    invalid = {"final": {"city": "Oslo"}}
    harness.register_agent(
        harness.Agent(
            name="s-counted",
            model=harness.ScriptedModel([invalid] * 4),
            output_type=Forecast,
            output_retries=1,
        )
    )
    rig = Rig(memory_store)
    rt = rig.runtime()
    run_id = create_run(rt, "s-counted", "what to wear?")
    rig.drive(limit=1)  # the first invalid answer; its retry's turn is pending
    conversation.send_message(rt, run_id, "a hint")
    rig.drive()
    steps = rig.store.steps(run_id)
    assert [(s.kind.value, s.args.get("invalid_answers")) for s in steps] == [
        ("model", None),
        ("user", None),
        ("model", 1),
    ]
    assert rig.load(run_id).status is RunStatus.FAILED
