"""Structured answers: ``Agent(output_type=SomePydanticModel, output_retries=2)``.

An agent with an output type wants its final answer as a JSON object that
validates against a pydantic model. The providers ask for it in their own
way (:func:`output_schema` gives both the same schema):

- OpenAI: ``response_format={"type": "json_schema", "json_schema": {"name",
  "schema", "strict"}}``; it applies to the text answer, the tools stay
  offered, so a turn may still call them;
- Anthropic: a tool named :data:`FINAL_TOOL` whose ``input_schema`` is the
  schema, offered beside the agent's tools (``tool_choice`` forces it when
  the agent has no tools of its own); a call of it is the final answer.

Whatever the model answered (text, or the final tool's input) is validated
here (:func:`validated`). A valid answer is stored as the JSON object, on the
model step (``{"final": {...}}``) and, as its JSON text, in the run's result
column, which the reads decode (:func:`shown_result`). An invalid one is
recorded on its model step with the error (``"invalid"``), and the model is
told (:func:`correction`) in its next turn, at most ``output_retries`` times
before the run fails with that error (harness.engine.steps).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.errors import BadInput
from harness.inputs import checked_json
from harness.records import JSON, Run, RunStatus, Step, StepKind

#: The tool an Anthropic model answers with (the agent may have no tool of this name).
FINAL_TOOL = "final_answer"
FINAL_TOOL_DESCRIPTION = (
    "Give your final answer: call this tool once, with the answer as its input, "
    "when you have it. Nothing else ends the task."
)
#: The model step's argument counting the invalid answers so far (so a retry's
#: count is durable: it is on the step, like every other argument).
INVALID_ANSWERS = "invalid_answers"
#: How much of a validation error is kept (it is the run's error, and the model reads it).
MAX_ERROR = 2000
_NAME = re.compile(r"[^a-zA-Z0-9_-]")
_FENCE = re.compile(r"\A```[a-zA-Z]*\s*\n(.*)\n\s*```\Z", re.S)
#: JSON schema keywords whose value is a schema, or a list or map of schemas.
_SUBSCHEMA = ("items", "not", "additionalProperties", "contains")
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


class InvalidAnswer(Exception):
    """A final answer that does not validate; its message says why, on one line."""


@dataclass(frozen=True)
class OutputSchema:
    """What a provider is asked for: ``name`` (``[a-zA-Z0-9_-]{1,64}``, the
    model class's), its ``description`` (the class's docstring), the JSON
    ``schema``, and ``strict``: the schema is OpenAI's strict subset (every
    object closed, every property required), so OpenAI guarantees it."""

    name: str
    description: str | None
    schema: dict[str, JSON]
    strict: bool


def check_output_type(output_type: object) -> None:
    """Refuse what is not a pydantic model class, in one line."""
    if not (isinstance(output_type, type) and issubclass(output_type, BaseModel)):
        raise TypeError(
            f"output_type must be a pydantic model class (a subclass of pydantic.BaseModel), "
            f"not {output_type!r}"
        )


@functools.cache
def output_schema(output_type: type[BaseModel]) -> OutputSchema:
    """The schema providers are asked for. Made strict when it can be (as the
    ``openai`` SDK's ``parse`` does): every object closed and every property
    required (a field with a default must then be given; validation still
    accepts an answer without it). A model that allows extra fields, or has a
    mapping field, keeps its schema as it is, not strict."""
    schema = output_type.model_json_schema()
    strict = copy.deepcopy(schema)
    closable = _close(strict)
    name = _NAME.sub("_", output_type.__name__)[:64] or "answer"
    description = schema.get("description")
    return OutputSchema(
        name,
        description if isinstance(description, str) else None,
        strict if closable else schema,
        closable,
    )


def _close(node: Any) -> bool:
    """Make every object schema in ``node`` closed with every property
    required, in place; False if one cannot be (it allows other properties)."""
    if not isinstance(node, dict):
        return True
    closable = True
    if node.get("type") == "object" or "properties" in node:
        extra = node.get("additionalProperties")
        if extra is not None and extra is not False:
            closable = False
        node["additionalProperties"] = False
        node["required"] = list(node.get("properties") or {})
    node.pop("default", None)  # every property is required: a default says nothing
    for key in _SUBSCHEMA:
        closable = _close(node.get(key)) and closable
    for key in _SUBSCHEMAS:
        for sub in node.get(key) or ():
            closable = _close(sub) and closable
    for key in _SCHEMA_MAPS:
        for sub in (node.get(key) or {}).values():
            closable = _close(sub) and closable
    return closable


def validated(output_type: type[BaseModel] | None, answer: str | Mapping[str, JSON]) -> JSON:
    """The answer as the JSON object it stands for, validated against
    ``output_type`` (None: an object given as one is taken as it is), or
    :class:`InvalidAnswer`. Text is parsed as JSON (inside a Markdown code
    fence too); the object returned is the model's dump, defaults filled in."""
    if output_type is None:
        if isinstance(answer, str):
            raise InvalidAnswer("a text answer where a JSON object was expected")
        return _storable(dict(answer))
    try:
        if isinstance(answer, str):
            text = answer.strip()
            fenced = _FENCE.match(text)
            value = output_type.model_validate_json(fenced.group(1) if fenced else text)
        else:
            value = output_type.model_validate(answer)
    except ValidationError as err:
        raise InvalidAnswer(describe(err, output_type.__name__)) from None
    return _storable(value.model_dump(mode="json"))


def _storable(value: dict[str, Any]) -> JSON:
    try:
        return checked_json(value, "the answer")
    except BadInput as err:  # NaN, too deep: no column holds it
        raise InvalidAnswer(f"the answer is not storable JSON: {err.problem}") from None


def describe(err: ValidationError, title: str) -> str:
    """A validation error on one line: each problem's place, what is wrong,
    and the value given where it says something."""
    problems = []
    for found in err.errors(include_url=False):
        where = ".".join(str(part) for part in found["loc"]) or "the answer"
        said = f"{where}: {found['msg']}"
        if found["type"] not in ("missing", "json_invalid", "model_type", "model_attributes_type"):
            given = json.dumps(found.get("input"), ensure_ascii=False, default=repr)
            said += f" (given {given[:60]}{'...' if len(given) > 60 else ''})"
        problems.append(said)
    count = len(problems)
    text = f"{count} validation error{'s' * (count != 1)} for {title}: " + "; ".join(problems)
    return text[:MAX_ERROR]


def as_text(answer: JSON) -> str:
    """A valid answer as the run's result column holds it: its JSON text."""
    return json.dumps(answer, ensure_ascii=False)


def correction(error: str) -> str:
    """What the model is told of its invalid answer, as the next turn's input."""
    return (
        f"Your final answer does not match the required output schema: {error}. "
        "Give your final answer again, corrected."
    )


def is_structured(step: Step | None) -> bool:
    """Is ``step`` a model step whose final answer is a JSON object?"""
    if step is None or step.kind is not StepKind.MODEL or not isinstance(step.result, dict):
        return False
    return isinstance(step.result.get("final"), dict) and "invalid" not in step.result


def may_be_structured(run: Run) -> bool:
    """Could the run's result be a structured answer's text? (Only then do
    the reads look at its final step.)"""
    return (
        run.status is RunStatus.COMPLETED
        and run.result is not None
        and run.result.startswith("{")
        and run.cursor > 0
    )


def shown_result(run: Run, final_step: Step | None) -> JSON:
    """The run's ``result`` as the reads show it: the JSON object of a
    structured final answer (``final_step``, the step before the run's
    cursor, says it is one), else the text as stored."""
    if not may_be_structured(run) or not is_structured(final_step):
        return run.result
    assert run.result is not None and final_step is not None
    if final_step.index != run.cursor - 1:
        return run.result
    try:
        value = json.loads(run.result)
    except ValueError:
        return run.result
    return value if isinstance(value, dict) else run.result
