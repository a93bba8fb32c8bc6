"""Request bodies and response shapes: what ``/openapi.json`` documents.

Bodies refuse fields they do not know (a misspelt ``max_cost_usd`` must not
be ignored silently). Responses carry the JSON of the read service: a run
is exactly the JSON of ``harness show --json``, whose fields are listed in
harness.records; the shapes here name the envelope and the fields a client
relies on, and let the rest through.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from harness.errors import BadInput
from harness.inputs import MAX_GOAL, checked_json, checked_text
from harness.records import RunStatus, StepKind, StepStatus

#: The longest operator name (``by``) the API accepts, in characters.
MAX_NAME = 200
#: A run id that can sit in a URL path: letters, digits and ``._:-``.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
#: The longest free text (a reason) the API accepts, in characters.
MAX_TEXT = 10_000

#: The largest integer a query or a body may carry: the store's integer
#: columns (a step's index, a version, a token budget) are PostgreSQL's
#: ``integer``, and a larger value would fail there as a database error.
MAX_INT = 2**31 - 1


def _storable(value: str | None) -> str | None:
    """Text refused unless a column can hold it unchanged (harness.inputs):
    a NUL or a lone surrogate is a validation error of the field, a 422."""
    if value is None:
        return None
    try:
        return checked_text(value, "text", limit=MAX_GOAL)  # each field's own length came first
    except BadInput as err:
        raise _invalid("unstorable_text", err) from None


def _json_value(value: Any) -> Any:
    """A JSON value refused unless every column and reader can hold it
    (harness.inputs.checked_json: depth, NaN, huge integers)."""
    try:
        return checked_json(value, "value")
    except BadInput as err:
        raise _invalid("unstorable_json", err) from None


def _invalid(kind: str, err: BadInput) -> PydanticCustomError:
    """``err`` as pydantic's error: the API's 422 names the field, then the problem."""
    return PydanticCustomError(kind, "{problem}", {"problem": err.problem})


#: Text for a column: a NUL or a lone surrogate is refused.
Storable = AfterValidator(_storable)
#: A JSON value for a column: too deep, NaN or a huge integer is refused.
JsonValue = AfterValidator(_json_value)

Attention = Literal[
    "paused", "in_doubt", "awaiting_approval", "child_waiting", "unswept", "stuck", "blocked"
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ByOperator(_Body):
    """An operator's decision, recorded with who made it."""

    by: Annotated[str | None, Storable] = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME,
        description="Who decides, as recorded (default: api)",
    )


class StartRun(_Body):
    agent: Annotated[str, Storable] = Field(
        min_length=1, max_length=200, description="A registered agent's name"
    )
    goal: Annotated[str, Storable] = Field(min_length=1, max_length=MAX_GOAL)
    run_id: str | None = Field(
        default=None,
        pattern=RUN_ID_PATTERN,
        description="Explicit id: starting the same id again is a no-op answered 200",
    )


class Cancel(_Body):
    reason: Annotated[str, Storable] = Field(
        default="cancelled by operator", min_length=1, max_length=MAX_TEXT
    )


class Resolve(_Body):
    decision: Literal["retry", "succeeded", "fail"]
    result: Annotated[Any, JsonValue] = Field(
        default=None, description="The call's result, with `succeeded`"
    )
    force: bool = False


class Approve(ByOperator):
    step: int | None = Field(
        default=None, ge=0, le=MAX_INT, description="Default: the step it waits on"
    )
    args: Annotated[dict[str, Any] | None, JsonValue] = Field(
        default=None, description="Call it with these instead"
    )


class Reject(ByOperator):
    reason: Annotated[str, Storable] = Field(
        min_length=1, max_length=MAX_TEXT, description="Told to the model"
    )
    step: int | None = Field(default=None, ge=0, le=MAX_INT)


class Pause(ByOperator):
    """Only who asks."""


class Resume(ByOperator):
    max_tokens: int | None = Field(
        default=None, ge=1, le=MAX_INT, description="A raised token budget"
    )
    max_cost_usd: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="A raised spend budget"
    )
    max_steps: int | None = Field(default=None, ge=1, le=MAX_INT, description="A raised step limit")


class Message(BaseModel):
    """The user's next message to a run."""

    model_config = ConfigDict(extra="forbid")

    text: Annotated[str, Storable] = Field(
        min_length=1, max_length=MAX_GOAL, description="The message"
    )


class Sent(BaseModel):
    """What a message did: ``continued`` (a completed run goes on with it) or
    ``kept`` (the run's next model turn takes it)."""

    run_id: str
    outcome: str
    said: str


class Complete(ByOperator):
    """The answer to a deferred call: exactly one of ``result`` and ``error``."""

    result: Annotated[Any, JsonValue] = Field(default=None, description="The call's result")
    error: Annotated[str | None, Storable] = Field(
        default=None, min_length=1, max_length=MAX_TEXT, description="It failed: the model is told"
    )

    @model_validator(mode="after")
    def _one(self) -> Complete:
        given = self.model_fields_set & {"result", "error"}
        if len(given) != 1 or ("error" in given and self.error is None):
            raise ValueError('give exactly one of "result" (any JSON) and "error" (text)')
        return self


class Delivered(BaseModel):
    """What an answer or a signal did (``harness complete``/``signal --json``)."""

    run_id: str
    step: int | None = Field(description="The step it answered, or named; null: none yet")
    delivery: Literal["answered", "kept", "already"] = Field(
        description="answered: a deferred call took it; kept: until a step asks; "
        "already: received before, nothing changed"
    )
    changed: bool = Field(description="False: received before, nothing changed")
    said: str = Field(description="What happened, for a person")


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int


class WaitOut(BaseModel):
    """What a deferred call waits for (a tool step's ``wait``)."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["callback", "signal", "sleep", "child"]
    until: float | None = Field(description="When it times out, or a sleep ends; null: no limit")
    signal: str | None = None
    child: str | None = None


class StepOut(BaseModel):
    """One step, as in ``harness show --json``."""

    model_config = ConfigDict(extra="allow")

    index: int
    kind: StepKind
    status: StepStatus
    attempts: int
    retries: int
    tool: str | None
    args: dict[str, Any]
    result: Any
    error: str | None
    started_at: float | None
    finished_at: float | None
    abandoned: bool = Field(
        default=False, description="Left running in a run that has ended: it never finishes"
    )
    wait: WaitOut | None = Field(default=None, description="A tool step's wait, once deferred")
    waits_for: str | None = Field(
        default=None, description="A deferred call: what it waits for and until when"
    )


class ParentOut(BaseModel):
    run_id: str
    step: int = Field(description="The parent's step whose call started this run")


class ChildOut(BaseModel):
    run_id: str
    step: int | None = Field(description="The step of this run that started it")
    status: RunStatus


class RunOut(BaseModel):
    """A run's fields, as in ``harness show --json`` (without its steps)."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    agent: str
    goal: str
    status: RunStatus
    cursor: int
    version: int
    step_count: int
    owner: str | None
    result: str | dict[str, Any] | None = Field(
        description="The final answer: its text, or the JSON object of an agent with an output_type"
    )
    error: str | None
    created_at: float
    updated_at: float
    usage: Usage
    cost_usd: float
    pause_requested: bool
    parent: ParentOut | None = Field(default=None, description="A child run's parent")


class RunListed(RunOut):
    attention: Attention | None = Field(description="Why an operator should look, or null")
    attention_detail: str | None = Field(default=None, description="What is wrong, what to do")


class RunDetail(RunOut):
    """``harness show --json``: the run and all its steps."""

    attention: Attention | None = Field(default=None, description="As in a listing")
    attention_detail: str | None = None
    children: list[ChildOut] = Field(
        default_factory=list, description="The runs its steps started (harness.agent_tool)"
    )
    steps: list[StepOut]


class RunHeader(RunListed):
    """A run without its steps (``?steps=false``), for a long run's page."""

    children: list[ChildOut] = Field(
        default_factory=list, description="The runs its steps started (harness.agent_tool)"
    )


class Acted(RunHeader):
    """An operator action's answer: the run as it left it, and what it did."""

    changed: bool = Field(description="False: the run had this very decision already")
    message: str = Field(description="What it did, or what the run already had")


class RunCreated(BaseModel):
    run_id: str


class RunPage(BaseModel):
    runs: list[RunListed]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page")


class StepPage(BaseModel):
    steps: list[StepOut]
    total: int
    next_start: int | None = Field(description="Pass as `start` for the next page")


class EventOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    run_id: str
    version: int
    step_index: int | None
    to: str
    worker: str | None
    at: float
    detail: str | None


class EventPage(BaseModel):
    events: list[EventOut]
    next_after: int | None = Field(description="Pass as `after` for the next page")


class Problem(BaseModel):
    """Every error: a message for a person."""

    detail: str
    status: RunStatus | None = Field(
        default=None, description="With a 409 of an operator action: the run's status now"
    )


class Health(BaseModel):
    ok: bool
    store: str
