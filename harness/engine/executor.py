"""The step executor: a step's call made at most once per idempotency key.

A tool step's call, and a model step's response (recorded so that a crash
after it never pays for the model twice), both go through a Redis
claim-and-result cache over a durable SQL record.

The key is ``"{run_id}:{step_index}"``. A call first claims the key in Redis
(``SET NX PX`` in a script, so claim and lookup are one round trip); a key
already completed returns its stored result, a key claimed by another live
executor is *busy*. After the tool returns, its result goes into the SQL
record in the same transaction as the step's result checkpoint (first writer
wins). An executor that cannot commit that checkpoint keeps the result on its
own, SQL record first, then Redis (while it still holds the claim), so the
next executor adopts it. Redis is a cache: if it is down or was flushed, the
SQL record still stops a tool whose result was stored from running again.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from harness import faults
from harness.engine.leases import Lease
from harness.errors import (
    InDoubt,
    LeaseLost,
    RunNotFound,
    StepInterrupted,
    StepTimedOut,
    StoreError,
    ToolError,
    interruptions,
)
from harness.records import JSON, Step
from harness.store import Store, ToolRecord
from harness.tools import (
    Happened,
    NotHappened,
    ToolContext,
    ToolEffect,
    ToolSpec,
    WaitHooks,
    awaited,
)

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)


def _not_the_tools_fault() -> tuple[type[BaseException], ...]:
    """Raised out of a call as they are: the tool's own verdict, the store
    failing under it (reading the run's history: the step is retried), or
    the process stopping the call (an interruption: nothing is recorded)."""
    return (ToolError, StoreError, *interruptions())


RESULT_TTL_MS = 7 * 24 * 3600 * 1000
#: The ``tool`` of a model response's record.
MODEL_RECORD = "model"
_PREFIX = "harness:idem:"

_CLAIM = """
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'acquired', ''}
end
if string.sub(v, 1, 5) == 'done:' then return {'done', string.sub(v, 6)} end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'acquired', ''}
end
return {'busy', tostring(redis.call('PTTL', KEYS[1]))}
"""

_COMPLETE = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or not v then
  redis.call('SET', KEYS[1], 'done:' .. ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

_IF_OWNER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == 'release' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""


class ClaimState(StrEnum):
    ACQUIRED = "acquired"
    DONE = "done"
    BUSY = "busy"


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    result: JSON = None
    retry_after: float = 0.0


@dataclass(frozen=True)
class Called:
    """A tool step's result. ``record``: the idempotency record still to store;
    the step's result checkpoint stores it in the same transaction, and any
    exit that does not commit stores it on its own (:meth:`StepExecutor.preserve`).
    None when the result was read from the SQL record."""

    result: JSON
    record: ToolRecord | None = None
    #: How the call was answered, when not by calling the tool under its key
    #: (a replay's: served from its recording); the flight recorder keeps it.
    note: str | None = None


class ToolBusy(StepInterrupted):
    """Another executor holds the key's claim: come back after it expires."""

    def __init__(self, key: str, retry_after: float) -> None:
        super().__init__(f"idempotency key {key} is held by another executor")
        self.retry_after = retry_after


class Cache(Protocol):
    def claim(self, key: str, owner: str, ttl: float) -> Claim: ...
    def complete(self, key: str, owner: str, result: JSON) -> None: ...
    def renew(self, key: str, owner: str, ttl: float) -> None: ...
    def release(self, key: str, owner: str) -> None: ...


class NoCache:
    """No Redis configured: the SQL record alone, the lease guards concurrency."""

    def claim(self, key: str, owner: str, ttl: float) -> Claim:
        return Claim(ClaimState.ACQUIRED)

    def complete(self, key: str, owner: str, result: JSON) -> None:
        pass

    def renew(self, key: str, owner: str, ttl: float) -> None:
        pass

    def release(self, key: str, owner: str) -> None:
        pass


class RedisCache:
    """Claims and results in Redis. A Redis failure degrades to the SQL record."""

    def __init__(self, client: redis.Redis) -> None:
        import redis  # loaded already: ``client`` is one of its objects

        self.client = client
        #: What a Redis outage raises (redis-py is imported where a client is
        #: made: ``import harness`` must not load it, nor what it loads).
        self._unavailable = redis.RedisError
        self._claim = client.register_script(_CLAIM)
        self._complete = client.register_script(_COMPLETE)
        self._if_owner = client.register_script(_IF_OWNER)

    @classmethod
    def from_url(cls, url: str, timeout: float = 1.0) -> RedisCache:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        return cls(client)

    def claim(self, key: str, owner: str, ttl: float) -> Claim:
        try:
            state, payload = self._claim(keys=[_PREFIX + key], args=[owner, _ms(ttl)])
        except self._unavailable as err:
            log.warning("idempotency cache unavailable (%s); using the SQL record only", err)
            return Claim(ClaimState.ACQUIRED)
        state = ClaimState(state.decode())
        if state is ClaimState.DONE:
            return Claim(state, json.loads(payload))
        if state is ClaimState.BUSY:
            return Claim(state, retry_after=max(int(payload), 100) / 1000)
        return Claim(state)

    def complete(self, key: str, owner: str, result: JSON) -> None:
        self._quietly(self._complete, key, owner, json.dumps(result), RESULT_TTL_MS)

    def renew(self, key: str, owner: str, ttl: float) -> None:
        self._quietly(self._if_owner, key, owner, _ms(ttl))

    def release(self, key: str, owner: str) -> None:
        self._quietly(self._if_owner, key, owner, "release")

    def _quietly(self, script: Any, key: str, *args: Any) -> None:
        try:
            script(keys=[_PREFIX + key], args=list(args))
        except self._unavailable as err:
            log.warning("idempotency cache unavailable (%s); the SQL record still holds", err)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def cache_key(idempotency_key: str, namespace: str) -> str:
    """The Redis key of a step: its idempotency key within one incarnation of the run."""
    return f"{idempotency_key}@{namespace}"


class StepExecutor:
    """Executes tool calls through their idempotency keys, applying the
    in-doubt policy of ``at_most_once`` tools, and records model responses
    under theirs (:meth:`respond`).

    A result already stored (in Redis or in the SQL record) is returned
    instead of calling the tool again. Redis keys carry a ``namespace`` (the
    run's incarnation: :func:`harness.engine.checkpointing.run_namespace`),
    so a run id reused after its store was wiped, or a run pruned and
    imported again, never meets the old run's cached results. The runtime holds one; a replay
    wraps it in a Cassette (harness.engine.cassette) that serves recorded
    outcomes instead.
    """

    def __init__(
        self,
        store: Store,
        cache: Cache,
        claim_ttl: float,
        crash: faults.CrashPoints = faults.NEVER,
    ) -> None:
        self.store = store
        self.cache = cache
        self.claim_ttl = claim_ttl
        self.crash = crash

    def renew(self, step: Step, namespace: str, lease: Lease) -> None:
        """Keep this execution's claim on the step's key alive (the heartbeat calls it)."""
        self.cache.renew(cache_key(step.idempotency_key, namespace), lease.owner, self.claim_ttl)

    def execute(
        self,
        spec: ToolSpec,
        step: Step,
        kwargs: dict[str, Any],
        *,
        lease: Lease,
        recovered: bool,
        namespace: str,
        hooks: WaitHooks | None = None,
    ) -> Called:
        """The tool's result for this step: stored, or obtained by calling it now.

        ``step.attempts`` counts this attempt: only a step tried before can
        have a SQL record. ``recovered``: the step was found RUNNING, so a
        previous attempt may have acted on the world. Raises
        :class:`ToolBusy` while another executor holds the key.
        """
        key, owner = cache_key(step.idempotency_key, namespace), lease.owner
        claim = self.cache.claim(key, owner, self.claim_ttl)
        if claim.state is ClaimState.DONE:
            log.info("run=%s step=%d replayed stored result from cache", step.run_id, step.index)
            # The SQL record may be missing (it could not be written): the checkpoint adds it.
            return Called(claim.result, _record(step, spec, claim.result))
        if claim.state is ClaimState.BUSY:
            raise ToolBusy(key, claim.retry_after)
        if step.attempts > 1:
            found, stored = self._recorded(step, key, owner)
            if found:
                log.info("run=%s step=%d replayed stored result", step.run_id, step.index)
                self.cache.complete(key, owner, stored)
                return Called(stored)
        ctx = ToolContext(
            step.run_id,
            step.index,
            step.attempts,
            hooks,
            steps=functools.partial(self.store.steps, step.run_id),
        )
        if recovered and spec.effect is ToolEffect.AT_MOST_ONCE:
            try:
                verdict = self._reconcile(spec, ctx, _time_left(lease))
            except BaseException:  # in doubt, or stopped (an async reconcile timed out)
                self.cache.release(key, owner)
                raise
            if isinstance(verdict, Happened):
                return Called(verdict.result, _record(step, spec, verdict.result))
        try:
            if not lease.valid():  # a zombie must not act on the world
                raise LeaseLost(f"run {step.run_id}: lease lapsed before calling {spec.name}")
            result = spec.invoke(kwargs, ctx, _time_left(lease))
        except _not_the_tools_fault():
            self.cache.release(key, owner)
            raise
        except Exception as err:
            self.cache.release(key, owner)
            raise ToolError(f"tool {spec.name!r} raised {type(err).__name__}: {err}") from err
        except BaseException as err:
            self.cache.release(key, owner)
            if isinstance(err, StepTimedOut):
                log.error("run=%s step=%d %s", step.run_id, step.index, err)
            raise
        self.crash("after_tool_returned", "tool")
        return Called(result, _record(step, spec, result))

    def respond(self, step: Step, namespace: str, lease: Lease, call: Callable[[], JSON]) -> JSON:
        """A model step's response: the one recorded under its key, or ``call()``'s,
        recorded (SQL first, then Redis) before it is returned, so that no
        crash after this makes the step call (and pay for) the model again.

        As for a tool, ``step.attempts`` counts this attempt (a step whose
        model's responses are recorded is always claimed before it runs), so
        only a step tried (or retried) before can have a SQL record: the first
        attempt makes no lookup. Raises :class:`ToolBusy` while another executor
        holds the key.
        """
        found, stored = self.recorded_response(step, namespace, lease)
        if found:
            return stored
        try:
            response = call()
        except BaseException:
            self.release_response(step, namespace, lease)
            raise
        return self.keep_response(step, namespace, lease, response)

    def recorded_response(self, step: Step, namespace: str, lease: Lease) -> tuple[bool, JSON]:
        """The first half of :meth:`respond`: claim the step's key, and
        ``(True, response)`` if a response is recorded under it. After
        ``(False, None)`` the caller holds the claim: it calls the model and
        gives :meth:`keep_response` the response, or :meth:`release_response`
        if it has none (for a model that records its response itself, the
        moment it arrives, before its own code runs on it)."""
        key, owner = cache_key(step.idempotency_key, namespace), lease.owner
        claim = self.cache.claim(key, owner, self.claim_ttl)
        if claim.state is ClaimState.DONE:
            log.info("run=%s step=%d model response read back from cache", step.run_id, step.index)
            return True, claim.result
        if claim.state is ClaimState.BUSY:
            raise ToolBusy(key, claim.retry_after)
        if step.attempts > 1 or step.retries > 0:  # a retry: the response may be recorded
            found, stored = self._recorded(step, key, owner)
            if found:
                log.info("run=%s step=%d model response read back", step.run_id, step.index)
                self.cache.complete(key, owner, stored)
                return True, stored
        if not lease.valid():
            self.cache.release(key, owner)
            raise LeaseLost(f"run {step.run_id}: lease lapsed before calling the model")
        return False, None

    def keep_response(self, step: Step, namespace: str, lease: Lease, response: JSON) -> JSON:
        """Record a response (SQL first, then Redis) under the key claimed by
        :meth:`recorded_response`; returns the one recorded (first writer wins)."""
        record = ToolRecord(step.idempotency_key, step.index, MODEL_RECORD, response)
        kept = self.preserve(step, Called(response, record), namespace, lease)
        self.crash("after_model_returned", "model")
        return kept

    def release_response(self, step: Step, namespace: str, lease: Lease) -> None:
        """Give up the claim of :meth:`recorded_response`: no response to keep."""
        self.cache.release(cache_key(step.idempotency_key, namespace), lease.owner)

    def _recorded(self, step: Step, key: str, owner: str) -> tuple[bool, JSON]:
        """The step's SQL record, if any; a failure to read it releases our claim
        on the key, so that the retry of this step is not kept out by it."""
        try:
            return self.store.get_tool_result(step.idempotency_key)
        except BaseException:
            self.cache.release(key, owner)
            raise

    def _reconcile(
        self, spec: ToolSpec, ctx: ToolContext, timeout: float | None
    ) -> Happened | NotHappened:
        """Ask the outside world whether the interrupted call happened; InDoubt if unknown."""
        where = f"step {ctx.step_index} ({spec.name}) is at_most_once and was interrupted"
        if spec.reconcile is None:
            raise InDoubt(f"{where}; it may have run: resolve it with `harness resolve`")
        try:
            verdict = awaited(spec.reconcile(ctx), timeout, f"reconcile of {spec.name!r}")
        except Exception as err:
            raise InDoubt(
                f"{where}; reconcile failed ({type(err).__name__}: {err}): "
                "resolve it with `harness resolve`"
            ) from err
        if isinstance(verdict, Happened | NotHappened):
            log.info("run=%s step=%d reconciled: %s", ctx.run_id, ctx.step_index, verdict)
            return verdict
        raise InDoubt(f"{where}; reconcile could not tell: resolve it with `harness resolve`")

    def preserve(self, step: Step, called: Called, namespace: str, lease: Lease) -> JSON:
        """Keep a result that its step's checkpoint did not commit (the run was
        taken over or cancelled, or the store failed for longer than the lease):
        the SQL record first, first writer wins, then the Redis key, so that
        whoever carries the step on adopts the result instead of calling again,
        and ``harness resolve`` finds it. Failures are logged, never raised:
        this runs on the way out of a step that already failed."""
        if called.record is None:
            return called.result  # it came from the SQL record: already kept
        key = cache_key(step.idempotency_key, namespace)
        kept = called.result
        try:
            record = called.record
            kept = self.store.put_tool_result(
                record.key, step.run_id, step.index, record.tool, record.result, time.time()
            )
        except (StoreError, RunNotFound) as err:  # RunNotFound: pruned meanwhile
            log.warning(
                "run=%s step=%d result not stored in SQL (%s); kept in the cache only",
                step.run_id,
                step.index,
                err,
            )
        self.cache.complete(key, lease.owner, kept)
        return kept


def _time_left(lease: Lease) -> float | None:
    """Seconds until the step's time limit: an ``async def`` call is cancelled then."""
    return None if lease.deadline is None else lease.deadline - lease.clock.now()


def _record(step: Step, spec: ToolSpec, result: JSON) -> ToolRecord:
    return ToolRecord(step.idempotency_key, step.index, spec.name, result)
