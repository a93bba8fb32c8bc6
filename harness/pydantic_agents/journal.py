"""The seam into Pydantic AI: a durability capability whose journal is the run's steps.

Pydantic AI routes every model request and every tool call of an agent run
through a durability capability (``pydantic_ai.durable_exec``), as Temporal,
DBOS and Prefect use it. Here a harness step re-runs the agent from its
start with :class:`HarnessDurability` attached, and the backend answers
each operation from a :class:`Replay`:

* an operation already done (a model response or a tool result on an earlier
  step) returns its recorded result, and nothing is called;
* the one operation this step is for (its :class:`Target`: the next model
  request, or one tool call) is carried out, under the step's checkpoints;
* any other operation not yet done stops the re-run: :class:`Suspended`, a
  ``BaseException``, so that the agent's own ``except Exception`` cannot
  swallow it. The next step carries on from there.

Everything else (listing tools, validating arguments and outputs, event
handlers) is the agent's own code, re-run inline each time: it must come to
the same decisions every time (docs/ARCHITECTURE.md, "Pydantic AI agents").
Tool calls run one at a time inside the re-run, so the order of operations
is the same on every re-run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
)
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from pydantic_ai.usage import UsageLimits

#: A tool call's place in the run: (the model turn that asked for it, the
#: call's id in that turn, how many calls of that id in that turn came before).
CallKey = tuple[int, str, int]
#: The target of a step that is the agent's next model request.
MODEL = "model"
Target = str | CallKey


class Suspended(BaseException):
    """The re-run reached an operation that is not this step's to carry out.
    A BaseException, so that code in the agent cannot swallow it."""


@dataclass
class Replay:
    """What one re-run of the agent may use and do, and what it did.

    ``responses``: the recorded model responses, in order; ``results``: the
    recorded tool results by :data:`CallKey`; ``target``: the one operation
    to carry out. After the re-run: ``done`` (the target's result, JSON),
    ``error`` (what the target raised), ``stopped_at`` (the kind of the
    operation that suspended it), ``finished``/``output`` (the run ended)."""

    responses: list[Any]
    results: dict[CallKey, Any]
    target: Target
    turns: int = 0
    seen: dict[tuple[int, str], int] = field(default_factory=dict)
    done: Any = None
    did: bool = False
    error: Exception | None = None
    stopped_at: str | None = None
    finished: bool = False
    output: Any = None

    async def model_request(self, body: Callable[[], Awaitable[object]]) -> object:
        turn, self.turns = self.turns, self.turns + 1
        if turn < len(self.responses):
            return self.responses[turn]
        if self.target == MODEL and not self.did:
            return await self._carry_out(body)
        self.stopped_at = "model"
        raise Suspended

    async def tool_call(self, call_id: str, body: Callable[[], Awaitable[object]]) -> object:
        turn = self.turns - 1
        nth = self.seen.get((turn, call_id), 0)
        self.seen[(turn, call_id)] = nth + 1
        key = (turn, call_id, nth)
        if key in self.results:
            return self.results[key]
        if self.target == key and not self.did:
            return await self._carry_out(body)
        self.stopped_at = "tool"
        raise Suspended

    async def _carry_out(self, body: Callable[[], Awaitable[object]]) -> object:
        self.did = True
        try:
            self.done = await body()
        except Exception as err:  # the model's or the tool's own failure: the step's
            self.error = err
            raise Suspended from err
        return self.done


_REPLAY: ContextVar[Replay | None] = ContextVar("harness_pydantic_replay", default=None)


class _Backend(JournalCallableOperationBackend[None]):
    """Sends each operation to the current :class:`Replay`; what is not a
    step (discovery, validation, events) runs inline."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        replay = _REPLAY.get()
        if replay is None:  # outside a harness step: transparent
            return await body()
        if isinstance(operation_id, ModelRequestId):
            return await replay.model_request(body)
        if isinstance(operation_id, ToolsetCallToolId):
            ctx = cache_key[2]
            call_id = getattr(ctx, "tool_call_id", None) or str(cache_key[0])
            return await replay.tool_call(call_id, body)
        return await body()


class HarnessDurability(BaseDurabilityCapability[Any]):
    """Pydantic AI's durability seam, answered from the harness's steps."""

    engine_spec = DurabilityEngineSpec(
        engine_name="Celery agent harness",
        durable_unit_noun="step",
        durable_container_noun="run",
        codec=JSON_CODEC,  # results are stored as JSON on the steps
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        journal_discovery=False,
        sequential_tools_in_durable_context=True,
    )

    @property
    def in_durable_context(self) -> bool:
        return _REPLAY.get() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        config = RoleBasedOperationConfig[None](model=None, event=None, capability=None, tool=None)
        return _Backend(agent_name=self.name, config=config)


def _approved(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults | None:
    """A call the agent says needs approval has had the harness's before its
    step ran (the step waits ``awaiting_approval`` for ``harness approve``;
    ``harness reject`` answers it with the operator's reason instead)."""
    if not requests.approvals:
        return None
    return requests.build_results(approve_all=True)


async def rerun(
    agent: Agent[Any, Any],
    replay: Replay,
    prompt: str,
    deps: Any,
    usage_limits: UsageLimits | None = None,
) -> Replay:
    """Run ``agent`` on ``prompt`` from its start under ``replay``, until it
    ends or is suspended; ``replay`` says which, and what was done."""
    token = _REPLAY.set(replay)
    try:
        result = await agent.run(
            prompt,
            deps=deps,
            usage_limits=usage_limits,
            capabilities=[
                HarnessDurability(name=agent.name),
                HandleDeferredToolCalls(handler=_approved),
            ],
        )
    except Suspended:
        return replay
    finally:
        _REPLAY.reset(token)
    replay.finished, replay.output = True, result.output
    return replay
