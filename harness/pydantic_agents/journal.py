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
* any other operation not yet done parks the run there: the next step of
  the run, if it comes to this process, carries on from it
  (harness.pydantic_agents.live); otherwise it is stopped with
  :class:`Suspended`, a ``BaseException``, so that the agent's own ``except
  Exception`` cannot swallow it, and the next step re-runs the agent.

Everything else (listing tools, validating arguments and outputs, event
handlers) is the agent's own code, re-run inline each time: it must come to
the same decisions every time (docs/ARCHITECTURE.md, "Pydantic AI agents").
Tool calls run one at a time inside the re-run, so the order of operations
is the same on every re-run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelCompactMessagesId,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
)
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from pydantic_ai.usage import UsageLimits

#: A tool call's place in the run: (the model turn that asked for it, the
#: call's id in that turn, how many calls of that id in that turn came before).
CallKey = tuple[int, str, int]
#: The target of a step that is the agent's next model request.
MODEL = "model"
Target = str | CallKey


#: What a call of a tool step's turn that is not its own gets, met before
#: its own (:meth:`Replay._stands_in`): not made, and never shown to a model.
STAND_IN = {"kind": "tool_failed", "message": "another step's call: not made in this one"}

#: The kind of a recorded tool result that defers the call (Pydantic AI's
#: ``CallDeferred``, or a call of an external tool).
DEFERRED = "call_deferred"


def _asks_approval(result: object) -> bool:
    return isinstance(result, dict) and result.get("kind") == "approval_required"


def is_deferred(result: object) -> bool:
    """Is ``result`` a call's deferral, not its outcome?"""
    return isinstance(result, dict) and result.get("kind") == DEFERRED


class Suspended(BaseException):
    """The re-run reached an operation that is not this step's to carry out.
    A BaseException, so that code in the agent cannot swallow it."""


class NotJournaled(Exception):
    """An operation of the agent that is not a harness step and must not be
    re-run inline (a paid call): the run fails with it."""


@dataclass
class Replay:
    """One live run of the agent: what it may use and do, and what it did.

    ``responses``: the recorded model responses, in order; ``results``: the
    recorded tool results by :data:`CallKey`; ``target``: the one operation
    this step carries out. An operation neither recorded nor the target
    parks the run (:meth:`_park`): it waits there for the next step of the
    same run in this process (harness.pydantic_agents.live), or is told to
    stop, and then raises :class:`Suspended`. After a step: ``done`` (the
    target's result, JSON), ``error`` (what the target raised),
    ``stopped_at`` (the kind of the operation it parked at),
    ``finished``/``output`` (the run ended). ``got_responses`` and
    ``got_results``: every result the run has used, recorded or made, to
    tell whether it still matches the run's steps.

    ``keeper``: a model step's record of its response (:class:`Keeper`):
    the response is recorded the moment the call returns, before the
    agent's own code runs on it, and a response recorded already is used
    instead of calling. ``settled`` is set when the step may return: the
    run parked or ended, or, for a tool step, the tool returned (the
    agent's code after it belongs to the next step, which waits for
    ``resting``: the run parked or ended; ``returned`` says the tool did)."""

    responses: list[Any]
    results: dict[CallKey, Any]
    target: Target
    step: Any = None
    turns: int = 0
    seen: dict[tuple[int, str], int] = field(default_factory=dict)
    done: Any = None
    did: bool = False
    error: Exception | None = None
    stopped_at: str | None = None
    finished: bool = False
    output: Any = None
    got_responses: list[Any] = field(default_factory=list)
    got_results: dict[CallKey, Any] = field(default_factory=dict)
    parked: tuple[Target, asyncio.Future[bool]] | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    resting: asyncio.Event = field(default_factory=asyncio.Event)
    keeper: Keeper | None = None
    stopping: bool = False
    returned: bool = False
    #: The names of the tools (not output tools) the last model request offered.
    offered: frozenset[str] = frozenset()
    #: This step is a tool call an operator approved (``harness approve``).
    approved: bool = False
    #: The calls Pydantic AI asked approval for (:meth:`asks_approval`).
    asked: set[CallKey] = field(default_factory=set)
    #: A call was answered with a stand-in (:meth:`_stands_in`).
    tainted: bool = False

    async def model_request(self, body: Callable[[], Awaitable[object]]) -> object:
        turn, self.turns = self.turns, self.turns + 1
        if turn < len(self.responses):
            self.got_responses.append(self.responses[turn])
            return self.responses[turn]
        if not (self.target == MODEL and not self.did):
            await self._park(MODEL)
        done = await self._respond(body)
        self.got_responses.append(done)
        return done

    async def _respond(self, body: Callable[[], Awaitable[object]]) -> object:
        """The step's model response: its record if it has one, else the
        model's, recorded before the agent's code runs on it."""
        keeper = self.keeper
        if keeper is None:
            return await self._carry_out(body)
        found, response = keeper.recorded()
        if found:
            self.did, self.done = True, response
            return response
        try:
            done = await self._carry_out(body)
        except BaseException:
            keeper.release()
            raise
        self.done = keeper.keep(done)
        return self.done

    async def tool_call(self, call_id: str, body: Callable[[], Awaitable[object]]) -> object:
        key = self._key(call_id)
        self.seen[key[:2]] = key[2] + 1
        served, value = await self._reach(key)
        if served:
            return value
        if key in self.asked and not self.approved:
            done = self._refuse()
        else:
            done = await self._carry_out(body)
            if _asks_approval(done):  # asked by a wrapper inside a dynamic toolset
                if not self.approved:
                    done = self._refuse()
                else:  # Pydantic AI makes the approved call as the call's next operation
                    self.target, self.did, self.done = (key[0], key[1], key[2] + 1), False, None
                    return done
        self.got_results[key] = done
        self.returned = True
        self.settled.set()  # the tool step ends here: what follows is the next step's
        if is_deferred(done):
            # The step waits for the answer (harness.Deferred), and the re-run
            # after it is served the answer: this run does not go on.
            raise Suspended
        return done

    def asks_approval(self, call_id: str) -> None:
        """Pydantic AI asks approval for the call: it is approved, and made
        only by a step an operator approved (:meth:`tool_call`)."""
        self.asked.add(self._key(call_id))

    def _key(self, call_id: str) -> CallKey:
        """The key of the call's next operation in the current turn."""
        turn = self.turns - 1
        return (turn, call_id, self.seen.get((turn, call_id), 0))

    async def external_call(self, call_id: str, metadata: dict[str, Any] | None) -> object:
        """A call the agent defers without an operation (an ExternalToolset's
        tool): its recorded answer, or, as this step's target, a deferral
        (:data:`DEFERRED`) the step turns into a harness.Deferred."""
        key = self._key(call_id)
        served, value = await self._reach(key)
        if served:
            return value
        self.did, self.done = True, {"kind": DEFERRED, "metadata": metadata}
        self.got_results[key] = self.done
        self.returned = True
        self.settled.set()
        raise Suspended

    async def _reach(self, key: CallKey) -> tuple[bool, object]:
        """``(True, result)`` for a call answered without being made: its
        recorded result, or a stand-in (:meth:`_stands_in`); else, once this
        step is the one to make it (the run parks until then), ``(False, None)``."""
        if key in self.results:
            self.got_results[key] = self.results[key]
            return True, self.results[key]
        if not (self.target == key and not self.did):
            if self._stands_in(key):
                return True, dict(STAND_IN)
            await self._park(key)
        return False, None

    def _stands_in(self, key: CallKey) -> bool:
        """Is ``key`` another call of this tool step's turn, met before its
        own? Pydantic AI makes a turn's calls in its own order (function
        tools, then the external and approved ones), which need not be the
        order of their steps, and a call whose step waits for an answer is
        not recorded: such a call is answered with :data:`STAND_IN`, not
        made, so the re-run reaches this step's call. The run is then
        ``tainted``: never carried on (harness.pydantic_agents.live)."""
        target = self.target
        if isinstance(target, tuple) and not self.did and key[0] == target[0]:
            self.tainted = True
            return True
        return False

    async def _park(self, at: Target) -> None:
        """Wait here for a step whose target this is; Suspended if told to stop."""
        self.stopped_at = "model" if at == MODEL else "tool"
        if self.stopping:
            raise Suspended
        go: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.parked = (at, go)
        self.settled.set()
        self.resting.set()
        try:
            if not await go:
                raise Suspended
        finally:
            self.parked = None

    def resume(self, fresh: Replay) -> None:
        """Carry on from where the run is parked, which is ``fresh.target``,
        for ``fresh``'s step."""
        assert self.parked is not None and self.parked[0] == fresh.target
        self.target, self.step, self.keeper = fresh.target, fresh.step, fresh.keeper
        self.approved = fresh.approved
        self.done, self.did, self.error, self.stopped_at = None, False, None, None
        self.returned = False
        self.settled.clear()
        self.resting.clear()
        self.parked[1].set_result(True)

    def stop(self) -> None:
        """End the run where it parks (at once if it is parked): its
        operation raises Suspended."""
        self.stopping = True
        if self.parked is not None and not self.parked[1].done():
            self.parked[1].set_result(False)

    def _refuse(self) -> object:
        """The outcome of a call Pydantic AI asked approval for that no
        operator gave: the harness did not know to ask (a tool a dynamic
        toolset wraps in ``approval_required()``). Not made; the model is told."""
        self.did = True
        self.done = {
            "kind": "tool_failed",
            "message": "the tool asked for approval when called, which the harness did not "
            "know to ask an operator for: name it in requires_approval= (not called)",
        }
        return self.done

    async def _carry_out(self, body: Callable[[], Awaitable[object]]) -> object:
        self.did = True
        try:
            self.done = await body()
        except Exception as err:  # the model's or the tool's own failure: the step's
            self.error = err
            raise Suspended from err
        return self.done


class Keeper(Protocol):
    """A model step's record of its response (harness.pydantic_agents.driver)."""

    def recorded(self) -> tuple[bool, Any]:
        """``(True, response)`` if the step's response is recorded."""

    def keep(self, response: Any) -> Any:
        """Record ``response``; returns the one recorded (first writer wins)."""

    def release(self) -> None:
        """No response to record (the call failed or was stopped)."""


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
            parameters = cache_key[3] if len(cache_key) > 3 else None
            offered = getattr(parameters, "function_tools", None) or ()
            replay.offered = frozenset(tool.name for tool in offered)
            return await replay.model_request(body)
        if isinstance(operation_id, ToolsetCallToolId):
            ctx = cache_key[2]
            call_id = getattr(ctx, "tool_call_id", None) or str(cache_key[0])
            return await replay.tool_call(call_id, body)
        if isinstance(operation_id, ModelCompactMessagesId):  # refused at registration too
            raise NotJournaled("message compaction is a model call that is not a harness step")
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


async def _deferred(
    ctx: RunContext[Any], requests: DeferredToolRequests
) -> DeferredToolResults | None:
    """Pydantic AI's deferred calls, answered by the harness.

    Approvals: a call that needs one has had the harness's before its step
    ran (the step waits ``awaiting_approval`` for ``harness approve``;
    ``harness reject`` answers it with the operator's reason instead), so
    it is approved here; one the harness did not know to ask for (a tool
    a dynamic toolset wraps in ``approval_required()``) is not made, and
    the model is told why (:meth:`Replay.tool_call`). Calls (an external
    tool's): the answer recorded on its step (``harness complete``, a
    callback or a signal), or, for the step that makes the call, a deferral
    that becomes harness.Deferred."""
    replay = _REPLAY.get()
    if replay is None:
        return requests.build_results(approve_all=True) if requests.approvals else None
    for call in requests.approvals:
        replay.asks_approval(call.tool_call_id)
    results = requests.build_results(approve_all=True)
    for call in requests.calls:
        recorded = await replay.external_call(
            call.tool_call_id, requests.metadata.get(call.tool_call_id)
        )
        results.calls[call.tool_call_id] = answer(recorded)
    return results


def answer(recorded: object) -> object:
    """A recorded answer to a deferred call, as Pydantic AI takes it."""
    if isinstance(recorded, dict) and recorded.get("kind") == "tool_failed":
        return ToolFailed(str(recorded.get("message") or "the call failed"))
    if isinstance(recorded, dict) and recorded.get("kind") == "tool_return":
        return recorded.get("result")
    return recorded


async def drive(
    agent: Agent[Any, Any],
    replay: Replay,
    prompt: str,
    deps: Any,
    usage_limits: UsageLimits | None = None,
) -> None:
    """Run ``agent`` on ``prompt`` from its start under ``replay`` (the body of
    a live run's task): ``replay.settled`` is set when it parks or ends."""
    _REPLAY.set(replay)  # in this task's own context
    try:
        result = await agent.run(
            prompt,
            deps=deps,
            usage_limits=usage_limits,
            capabilities=[
                HarnessDurability(name=agent.name),
                HandleDeferredToolCalls(handler=_deferred),
            ],
        )
        replay.finished, replay.output = True, result.output
    except Suspended:
        pass
    finally:
        replay.settled.set()
        replay.resting.set()


def current() -> Replay | None:
    """The live run whose code is running now (None outside one)."""
    return _REPLAY.get()
