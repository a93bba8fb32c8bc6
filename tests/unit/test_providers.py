"""Provider conformance: OpenAI and Anthropic through their real SDKs.

Every test makes real HTTP round trips to a local server that speaks both
wire formats and checks requests as strictly as the real services do
(tests.wire): tool results must answer every call id, in the provider's
format. The runner executes in-process on SQLite with a hand-moved clock,
so a back-off of 30 s costs nothing; tests/integration/test_provider_workers.py
runs the same providers in real workers, with SIGKILLs and rate limits.
"""

from __future__ import annotations

import math
import socket
import sys
import threading
import time
from typing import Any

import fakeredis
import pytest
import redis

import harness
from harness.agents import register_agent
from harness.celery.config import sends_delayed, step_options
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.engine.steps import RAW_ARGUMENTS, retry_delay
from harness.engine.taskresult import TaskResult
from harness.errors import ConfigError
from harness.providers.base import ProviderModel, retry_after, tool_schema
from harness.providers.prices import Prices
from harness.providers.ratelimit import RateLimiter, parse_limits
from harness.reads import Reads
from harness.records import RunStatus, StepKind, StepStatus
from harness.settings import Settings
from harness.store.memory import MemoryStore
from tests.rig import Rig
from tests.wire import WireServer

PROVIDERS = ("openai", "anthropic")


@harness.tool(effect="read_only")
def weather(city: str, ctx: harness.ToolContext, unit: str = "C") -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "temp": 21, "unit": unit, "key": ctx.idempotency_key}


@harness.tool(effect="idempotent")
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


def model_for(provider: str, **params: Any) -> ProviderModel:
    if provider == "openai":
        return harness.OpenAIModel("gpt-test", **params)
    return harness.AnthropicModel("claude-test", **params)


def agent(provider: str, name: str = "bot", **options: Any) -> harness.Agent:
    params = options.pop("params", {})
    return register_agent(
        harness.Agent(
            name=name,
            model=model_for(provider, **params),
            tools=[weather, explode],
            **options,
        )
    )


def run(rig: Rig, goal: str, agent_name: str = "bot") -> str:
    run_id = create_run(rig.runtime(), agent_name, goal)
    rig.drive()
    return run_id


@pytest.fixture
def rig(memory_store: MemoryStore) -> Rig:
    return Rig(memory_store)


TWO_CITIES = [
    {
        "text": "Looking both up.",
        "tool_calls": [
            {"name": "weather", "args": {"city": "Paris"}},
            {"name": "weather", "args": {"city": "Oslo", "unit": "F"}},
        ],
    },
    {"text": "Paris 21C, Oslo 21F."},
]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_parallel_calls_become_steps_and_are_answered_by_id(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    agent(provider)
    wire.script("two cities", TWO_CITIES)
    run_id = run(rig, "two cities")

    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    assert done.result == "Paris 21C, Oslo 21F."
    steps = rig.store.steps(run_id)
    assert [(s.kind, s.tool) for s in steps] == [
        (StepKind.MODEL, None),
        (StepKind.TOOL, "weather"),
        (StepKind.TOOL, "weather"),
        (StepKind.MODEL, None),
    ]
    # One idempotency key per call.
    assert [s.result["key"] for s in steps[1:3]] == [f"{run_id}:1", f"{run_id}:2"]
    prefix = "call" if provider == "openai" else "toolu"
    assert [c["id"] for c in steps[0].result["tool_calls"]] == [f"{prefix}_0_0", f"{prefix}_0_1"]
    # The second request carried both answers, each under its call's id (the
    # server rejects a conversation with a call left unanswered).
    last = wire.requests[-1].body
    if provider == "openai":
        answers = [m for m in last["messages"] if m["role"] == "tool"]
        assert [a["tool_call_id"] for a in answers] == ["call_0_0", "call_0_1"]
        assert '"city": "Oslo"' in answers[1]["content"]
    else:
        answer = last["messages"][2]
        assert answer["role"] == "user"
        ids = [b["tool_use_id"] for b in answer["content"] if b["type"] == "tool_result"]
        assert ids == ["toolu_0_0", "toolu_0_1"]
    assert wire.billed("two cities", 0) == wire.billed("two cities", 1) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_tools_are_offered_with_schemas_without_the_context(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    agent(provider)
    wire.script("hello", [{"text": "hi"}])
    run(rig, "hello")
    body = wire.requests[0].body
    offered = {
        (t["function"]["name"] if provider == "openai" else t["name"]): t for t in body["tools"]
    }
    schema = (
        offered["weather"]["function"]["parameters"]
        if provider == "openai"
        else offered["weather"]["input_schema"]
    )
    assert set(schema["properties"]) == {"city", "unit"}  # no ctx
    assert schema["required"] == ["city"]
    assert schema["additionalProperties"] is False
    description = (
        offered["weather"]["function"]["description"]
        if provider == "openai"
        else offered["weather"]["description"]
    )
    assert description == "The weather in a city."


def test_tool_schema_of_a_context_only_tool_is_an_empty_object() -> None:
    @harness.tool
    def ping(ctx: harness.ToolContext) -> str:
        return "pong"

    schema = tool_schema(ping)
    assert schema["type"] == "object"
    assert schema["properties"] == {}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_tool_error_and_bad_arguments_go_back_to_the_model(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    agent(provider)
    wire.script(
        "errors",
        [
            {
                "tool_calls": [
                    {"name": "explode", "args": {"reason": "boom"}},
                    {"name": "weather", "args": {"town": "Paris"}},
                    {"name": "nope", "args": {}},
                ]
            },
            {"text": "I saw the errors."},
        ],
    )
    run_id = run(rig, "errors")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    steps = rig.store.steps(run_id)
    assert [s.status for s in steps[1:4]] == [StepStatus.FAILED] * 3
    assert "boom" in (steps[1].error or "")
    assert "city" in (steps[2].error or "")
    assert "unknown tool 'nope'" in (steps[3].error or "")
    last = wire.requests[-1].body
    if provider == "openai":
        answers = [m["content"] for m in last["messages"] if m["role"] == "tool"]
        assert all('"error"' in a for a in answers)
    else:
        blocks = last["messages"][2]["content"]
        assert [b.get("is_error") for b in blocks] == [True, True, True]
        assert "boom" in blocks[0]["content"]


def test_arguments_that_are_not_json_are_answered_with_an_error(wire: WireServer, rig: Rig) -> None:
    agent("openai")
    wire.script(
        "bad json",
        [
            {"tool_calls": [{"name": "weather", "raw_arguments": '{"city": "Par'}]},
            {"text": "sorry"},
        ],
    )
    run_id = run(rig, "bad json")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    tool = rig.store.steps(run_id)[1]
    assert tool.status is StepStatus.FAILED
    assert tool.args == {RAW_ARGUMENTS: '{"city": "Par'}
    assert "not a JSON object" in (tool.error or "")
    # The model's own arguments went back verbatim with the error.
    messages = wire.requests[-1].body["messages"]
    assistant = next(m for m in messages if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'


STOP_REASONS = {
    "openai": {"stop": False, "length": False, "content_filter": False, "tool_calls": True},
    "anthropic": {
        "end_turn": False,
        "max_tokens": False,
        "stop_sequence": False,
        "refusal": False,
        "pause_turn": False,
        "tool_use": True,
    },
}


@pytest.mark.parametrize(
    ("provider", "stop"), [(p, s) for p, reasons in STOP_REASONS.items() for s in reasons]
)
def test_every_stop_reason_is_recorded(
    provider: str, stop: str, wire: WireServer, rig: Rig
) -> None:
    """A turn with tool calls goes on; one without is the final answer, whatever
    stopped it (truncated, filtered, refused), and says why on its step."""
    agent(provider)
    calls = STOP_REASONS[provider][stop]
    first: dict[str, Any] = {"text": "partial", "stop": stop}
    if calls:
        first["tool_calls"] = [{"name": "weather", "args": {"city": "Rome"}}]
    wire.script(f"stop {stop}", [first, {"text": "done"}])
    run_id = run(rig, f"stop {stop}")
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED
    model = rig.store.steps(run_id)[0]
    assert model.result["stop_reason"] == stop
    assert done.result == ("done" if calls else "partial")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_usage_is_recorded_per_step_and_summed_per_run_with_cost(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    name = "openai:gpt-test" if provider == "openai" else "anthropic:claude-test"
    rig.options["prices"] = Prices.parse(
        f'{{"{name}": {{"input": 2, "output": 10, "cached_input": 0.5, "cache_write": 4}}}}'
    )
    agent(provider)
    cached: dict[str, int] = {"cached_tokens": 40}
    if provider == "anthropic":
        cached["cache_creation_tokens"] = 7
    wire.script(
        "usage",
        [
            {
                "tool_calls": [{"name": "weather", "args": {"city": "Lima"}}],
                "usage": {"input_tokens": 100, "output_tokens": 20, **cached},
            },
            {"text": "ok", "usage": {"input_tokens": 150, "output_tokens": 30}},
        ],
    )
    run_id = run(rig, "usage")
    done = rig.load(run_id).to_dict()
    steps = [s.to_dict() for s in rig.store.steps(run_id)]
    first, last = steps[0], steps[2]
    if provider == "openai":
        assert done["usage"] == {"input_tokens": 250, "output_tokens": 50}
        assert first["usage"] == {"input_tokens": 100, "output_tokens": 20, "cached_tokens": 40}
        # 60 uncached at $2, 40 cached at $0.5, 20 out at $10 per million.
        first_cost = (60 * 2 + 40 * 0.5 + 20 * 10) / 1e6
    else:
        # Anthropic reports its cache reads and writes beside input_tokens: added in.
        assert done["usage"] == {"input_tokens": 297, "output_tokens": 50}
        assert first["usage"] == {
            "input_tokens": 147,
            "output_tokens": 20,
            "cache_read_input_tokens": 40,
            "cache_creation_input_tokens": 7,
        }
        first_cost = (100 * 2 + 40 * 0.5 + 7 * 4 + 20 * 10) / 1e6
    assert last["usage"] == {"input_tokens": 150, "output_tokens": 30}
    assert first["cost_usd"] == pytest.approx(first_cost)
    assert done["cost_usd"] == pytest.approx(first_cost + (150 * 2 + 30 * 10) / 1e6)
    assert steps[1]["kind"] == "tool" and "usage" not in steps[1]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("count", [2**31, -5, 10**1000], ids=["2**31", "negative", "1001 digits"])
def test_usage_no_column_holds_fails_the_run_with_a_clear_error(
    provider: str, count: int, wire: WireServer, rig: Rig
) -> None:
    """A provider's token counts are a door: one the run's 32-bit columns cannot
    hold fails the run once, saying so, instead of a write that never lands."""
    agent(provider)
    wire.script("absurd", [{"text": "ok", "usage": {"input_tokens": count, "output_tokens": 1}}])
    run_id = run(rig, "absurd")
    done = rig.load(run_id)
    assert done.status is RunStatus.FAILED
    assert done.error is not None and "input_tokens" in done.error
    assert f"outside 0..{2**31 - 1}" in done.error
    assert done.input_tokens == 0 and len(wire.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("count", [math.nan, 2.5], ids=["NaN", "a fraction"])
def test_usage_that_is_no_count_fails_the_run_naming_it(
    provider: str, count: float, wire: WireServer, rig: Rig
) -> None:
    agent(provider)
    wire.script("no count", [{"text": "ok", "usage": {"input_tokens": count, "output_tokens": 1}}])
    done = rig.load(run(rig, "no count"))
    assert done.status is RunStatus.FAILED and len(wire.requests) == 1
    assert done.error is not None and "the provider reported input_tokens" in done.error
    assert "\n" not in done.error


CACHED = {
    # 1,000 input tokens, 800 of them read from the provider's cache (and, for
    # Anthropic, 50 written to it), as each provider reports them.
    "openai": {"input_tokens": 1000, "output_tokens": 10, "cached_tokens": 800},
    "anthropic": {
        "input_tokens": 150,
        "output_tokens": 10,
        "cached_tokens": 800,
        "cache_creation_tokens": 50,
    },
}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cached_input_is_input_for_both_providers_and_their_budgets(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    """One rule: a turn's input_tokens are every input token it sent, cached or
    not, as OpenAI counts them; so a token budget counts cache reads and writes
    for both providers."""
    agent(provider, max_tokens=1100, params={"max_tokens": 50})
    wire.script(
        "cached",
        [
            {
                "tool_calls": [{"name": "weather", "args": {"city": "Lima"}}],
                "usage": CACHED[provider],
            },
            {"text": "never"},
        ],
    )
    run_id = run(rig, "cached")
    turn = rig.store.steps(run_id)[0].to_dict()
    assert (turn["usage"]["input_tokens"], turn["usage"]["output_tokens"]) == (1000, 10)
    stopped = rig.load(run_id)
    assert (stopped.input_tokens, stopped.output_tokens) == (1000, 10)
    # 1,010 used: the second turn's reservation does not fit in 1,100.
    assert stopped.status is RunStatus.FAILED
    assert (stopped.error or "").startswith("token budget: 1010 used + ")
    assert wire.calls("cached", 1) == 0


def test_a_token_budget_bounds_a_reply_the_request_set_no_limit_for(
    wire: WireServer, rig: Rig
) -> None:
    """The reservation counts 1,024 output tokens for a request that sets no
    limit; with a budget, that limit is sent, so a reply cannot take more (the
    server would have written 30,000 tokens)."""
    agent("openai", max_tokens=2000)
    wire.script("verbose", [{"text": "a long story", "usage": {"output_tokens": 30000}}])
    run_id = run(rig, "verbose")
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED
    assert done.input_tokens + done.output_tokens <= 2000
    assert wire.requests[0].body["max_completion_tokens"] == 1024
    assert rig.store.steps(run_id)[0].result["stop_reason"] == "length"


@pytest.mark.parametrize(
    ("provider", "options", "sent"),
    [
        ("openai", {"max_cost_usd": 1.0}, {"max_completion_tokens": 1024}),
        ("openai", {"max_tokens": 9000, "params": {"max_tokens": 300}}, {"max_tokens": 300}),
        ("openai", {}, {}),  # no budget: the request is as the model was given it
        ("anthropic", {"max_tokens": 9000}, {"max_tokens": 1024}),
        ("anthropic", {}, {"max_tokens": 1024}),  # the Messages API needs one anyway
    ],
)
def test_a_budgeted_request_carries_the_output_limit_it_reserved(
    provider: str, options: dict[str, Any], sent: dict[str, int], wire: WireServer, rig: Rig
) -> None:
    rig.options["prices"] = Prices.parse('{"gpt-test": {"input": 1, "output": 2}}')
    agent(provider, **options)
    wire.script("bounded", [{"text": "ok"}])
    run_id = run(rig, "bounded")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    body = wire.requests[0].body
    limits = {k: body[k] for k in ("max_tokens", "max_completion_tokens") if k in body}
    assert limits == sent


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_reply_without_usage_is_charged_its_reservation_as_an_estimate(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    """Some compatible servers report no usage: the turn is charged what was
    reserved for it (its request's input, estimated, and its output limit), and
    the step says the figures are an estimate."""
    agent(provider, max_tokens=100_000, params={"max_tokens": 200})
    wire.script(
        "uncounted",
        [
            {"tool_calls": [{"name": "weather", "args": {"city": "Lima"}}], "usage": None},
            {"text": "ok", "usage": None},
        ],
    )
    run_id = run(rig, "uncounted")
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED
    turns = [s.to_dict() for s in rig.store.steps(run_id) if s.kind is StepKind.MODEL]
    for turn in turns:
        assert turn["usage"]["estimated"] is True
        assert turn["usage"]["input_tokens"] > 0 and turn["usage"]["output_tokens"] == 200
    assert done.input_tokens == sum(t["usage"]["input_tokens"] for t in turns)
    assert done.output_tokens == 400


def fake_redis() -> redis.Redis:
    """A Redis of the test's own, in the process: the limiter's scripts run on its Lua."""
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


def test_the_token_rate_limit_counts_the_output_the_budget_reserves(
    wire: WireServer, rig: Rig
) -> None:
    """A request that sets no output limit is counted with the budget's 1,024
    output tokens, not 0: with 200 of 1,100 taken, it does not fit."""
    client = fake_redis()
    limiter = RateLimiter(
        client, parse_limits("openai:*=1100tpm"), window=60.0, clock=rig.clock.now
    )
    rig.options["limiter"] = limiter
    assert limiter.acquire("openai", "gpt-test", 200).wait == 0.0
    agent("openai")
    wire.script("counted", [{"text": "ok"}])
    run_id = create_run(rig.runtime(), "bot", "counted")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    assert [e.to_status for e in rig.store.events(run_id)][-1] == "rate_limited"
    assert wire.requests == []
    # It holds its place in the queue under its step's key, for its return.
    assert client.hexists("harness:rate:openai:gpt-test:queue", f"{run_id}:0")
    client.close()


def test_a_rate_limit_wait_past_the_deadline_ends_the_run_with_that_reason(
    wire: WireServer, rig: Rig
) -> None:
    client = fake_redis()
    limiter = RateLimiter(
        client, parse_limits("openai:*=1100tpm"), window=60.0, clock=rig.clock.now
    )
    rig.options["limiter"] = limiter
    assert limiter.acquire("openai", "gpt-test", 1000).wait == 0.0  # room again in ~60 s
    agent("openai", deadline=20.0)
    wire.script("hurried", [{"text": "too late"}])
    run_id = create_run(rig.runtime(), "bot", "hurried")
    assert rig.drive(limit=1) == [TaskResult.FAILED]
    failed = rig.load(run_id)
    assert failed.status is RunStatus.FAILED
    assert (failed.error or "").startswith("would pass its deadline of 20s waiting: rate limit of ")
    assert wire.requests == []
    # Its place in the queue is given up, not held for a run that will not come back.
    assert client.hlen("harness:rate:openai:gpt-test:queue") == 0
    client.close()


def test_a_retry_past_the_deadline_ends_the_run_with_that_reason(
    wire: WireServer, rig: Rig
) -> None:
    agent("openai", deadline=20.0)
    wire.script("hurried", [{"text": "late", "faults": [{"status": 503, "retry_after": 30}]}])
    run_id = create_run(rig.runtime(), "bot", "hurried")
    assert rig.drive(limit=1) == [TaskResult.FAILED]
    error = rig.load(run_id).error or ""
    assert error.startswith("would pass its deadline of 20s waiting: ") and "HTTP 503" in error
    assert wire.calls("hurried", 0) == 1


def test_a_model_without_a_price_has_a_null_cost(wire: WireServer, rig: Rig) -> None:
    agent("openai")
    wire.script("free", [{"text": "ok"}])
    run_id = run(rig, "free")
    assert rig.store.steps(run_id)[0].to_dict()["cost_usd"] is None
    assert rig.load(run_id).to_dict()["cost_usd"] == 0.0


@pytest.mark.parametrize(
    ("provider", "status"),
    [("openai", 429), ("openai", 500), ("openai", 503), ("anthropic", 429), ("anthropic", 529)],
)
def test_transient_failures_are_retried_durably_after_retry_after(
    provider: str, status: int, wire: WireServer, rig: Rig
) -> None:
    agent(provider)
    wire.script(
        "flaky",
        [
            {
                "text": "finally",
                "faults": [{"status": status, "retry_after": 30}, {"status": status}],
            }
        ],
    )
    run_id = create_run(rig.runtime(), "bot", "flaky")
    start = rig.clock.now()

    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    waiting = rig.load(run_id)
    step = waiting.current
    assert step is not None and step.status is StepStatus.PENDING
    assert (step.retries, step.attempts) == (1, 0)
    assert f"HTTP {status}" in (step.error or "")
    # The wake-up is in SQL, and the step message is sent with the same delay.
    assert waiting.wake_at is not None and 30 <= waiting.wake_at - start <= 33
    due, _, _ = rig.delayed[0]
    assert 30 <= due - start <= 33

    outcomes = rig.drive()
    assert outcomes[:1] == [TaskResult.RESCHEDULED]  # the second failure: no retry-after
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    assert rig.store.steps(run_id)[0].retries == 2
    assert wire.calls("flaky", 0) == 3
    assert wire.billed("flaky", 0) == 1
    kinds = [e.to_status for e in rig.store.events(run_id)]
    assert kinds.count("retry_scheduled") == 2
    assert Reads(rig.store, rig.clock, 900).stats()["model_retries"] == 2


def test_a_message_before_the_wake_up_is_dropped(wire: WireServer, rig: Rig) -> None:
    agent("openai")
    wire.script("early", [{"text": "ok", "faults": [{"status": 429, "retry_after": 60}]}])
    run_id = create_run(rig.runtime(), "bot", "early")
    rig.drive(limit=1)
    version = rig.load(run_id).version
    rig.sent.append((run_id, 0))  # a duplicate, on time for nothing
    assert rig.drive(limit=1) == [TaskResult.EARLY]
    assert rig.load(run_id).version == version
    assert wire.calls("early", 0) == 1


@pytest.mark.parametrize(
    ("provider", "status", "message"),
    [
        ("openai", 400, "maximum context length is 128000 tokens"),
        ("openai", 401, "Incorrect API key provided"),
        ("openai", 404, "The model does not exist"),
        ("anthropic", 400, "prompt is too long: 210000 tokens > 200000 maximum"),
        ("anthropic", 401, "invalid x-api-key"),
    ],
)
def test_permanent_errors_fail_the_run_at_once_with_the_providers_message(
    provider: str, status: int, message: str, wire: WireServer, rig: Rig
) -> None:
    agent(provider)
    wire.script("doomed", [{"text": "never", "faults": [{"status": status, "message": message}]}])
    run_id = run(rig, "doomed")
    failed = rig.load(run_id)
    assert failed.status is RunStatus.FAILED
    assert message in (failed.error or "")
    assert f"HTTP {status}" in (failed.error or "")
    assert wire.calls("doomed", 0) == 1


def test_an_exhausted_quota_fails_the_run_at_once_with_the_providers_message(
    wire: WireServer, rig: Rig
) -> None:
    """OpenAI's 429 ``insufficient_quota`` is no rate limit: waiting does not
    refill a quota, so it is not retried."""
    agent("openai")
    wire.script(
        "broke", [{"text": "never", "faults": [{"status": 429, "code": "insufficient_quota"}]}]
    )
    run_id = run(rig, "broke")
    failed = rig.load(run_id)
    assert failed.status is RunStatus.FAILED
    assert "HTTP 429" in (failed.error or "")
    assert "You exceeded your current quota" in (failed.error or "")
    assert wire.calls("broke", 0) == 1
    assert rig.store.steps(run_id)[0].retries == 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_timeout_is_the_steps_error_and_retried_then_fails_the_run(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    agent(provider, model_retries=1, params={"timeout": 0.3})
    wire.script("slow", [{"text": "late", "faults": [{"delay": 1.0}, {"delay": 1.0}]}])
    run_id = create_run(rig.runtime(), "bot", "slow")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    step = rig.load(run_id).current
    assert step is not None and "no response within 0.3s (timeout)" in (step.error or "")
    rig.drive()
    failed = rig.load(run_id)
    assert failed.status is RunStatus.FAILED
    assert "after 1 retries" in (failed.error or "")
    assert "timeout" in (failed.error or "")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_trickled_response_is_cut_at_the_calls_deadline(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    """The SDKs' timeout bounds each read, not the call: a server that sends a
    byte every 20 ms would hold the step for seconds, past its lease (and a
    takeover would pay twice). The whole call is bounded by the model's
    timeout: past it the connection is closed, the step's error says so, and
    the response cut short is never delivered (nor billed)."""
    agent(provider, params={"timeout": 0.5})
    wire.script("drip", [{"text": "ok", "faults": [{"trickle": 0.02}]}])
    run_id = create_run(rig.runtime(), "bot", "drip")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    step = rig.load(run_id).current
    assert step is not None and "no response within 0.5s (timeout)" in (step.error or "")
    assert wire.wait_idle(10.0)
    assert (wire.calls("drip", 0), wire.billed("drip", 0)) == (1, 0)


def test_the_bounded_client_still_takes_its_proxy_from_the_environment(
    wire: WireServer, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's client as the SDK makes it, with its transports bounded: a
    proxy set in the environment is still used (here one that refuses)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    agent("openai")
    wire.script("proxied", [{"text": "ok"}])
    run_id = create_run(rig.runtime(), "bot", "proxied")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    step = rig.load(run_id).current
    assert step is not None and "connection failed" in (step.error or "")
    assert wire.requests == []  # it went to the proxy, not straight to the server


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_dropped_connection_is_retried(provider: str, wire: WireServer, rig: Rig) -> None:
    agent(provider)
    wire.script("dropped", [{"text": "back", "faults": [{"drop": True}]}])
    run_id = run(rig, "dropped")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert "connection failed" in (
        next(e.detail for e in rig.store.events(run_id) if e.to_status == "retry_scheduled") or ""
    )


class Died(BaseException):
    """Stands in for a SIGKILL in-process (the real one: test_provider_workers)."""


def test_a_response_recorded_before_a_crash_is_not_bought_again(wire: WireServer, rig: Rig) -> None:
    def crash(point: str, kind: str) -> None:
        if point == "after_model_returned":
            raise Died

    agent("openai")
    wire.script("once", TWO_CITIES)
    run_id = create_run(rig.runtime(), "bot", "once")
    rig.options["crash"] = crash
    with pytest.raises(Died):
        rig.drive(limit=1)
    # A paid model step is checkpointed RUNNING before the call, under a lease.
    step = rig.load(run_id).current
    assert step is not None and (step.status, step.attempts) == (StepStatus.RUNNING, 1)
    rig.options.pop("crash")
    rig.sent.append((run_id, 0))  # the broker re-delivers it: the dead worker's lease holds
    assert rig.drive() == [TaskResult.LEASED]
    rig.clock.advance(rig.lease_ttl + 1)
    assert len(recovery.sweep(rig.runtime("sweeper"))) == 1
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert wire.billed("once", 0) == 1
    assert wire.calls("once", 0) == 1


def test_the_conversation_is_rebuilt_from_the_store_by_a_new_model(
    wire: WireServer, rig: Rig
) -> None:
    """Another worker (a new model object, a new client) continues the same
    conversation: nothing of it lived in the first one's memory."""
    agent("anthropic")
    wire.script("resume", TWO_CITIES)
    run_id = create_run(rig.runtime(), "bot", "resume")
    rig.drive(limit=3)  # the first turn and both tool calls
    agent("anthropic")  # re-registered: a fresh model, as in another process
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert wire.requests[-1].body["messages"][1]["content"][0] == {
        "type": "text",
        "text": "Looking both up.",
    }


@pytest.mark.parametrize("provider", PROVIDERS)
def test_system_prompt_and_params_reach_the_provider(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    agent(provider, params={"system": "Be brief.", "temperature": 0})
    wire.script("params", [{"text": "ok"}])
    run(rig, "params")
    body = wire.requests[0].body
    assert body["temperature"] == 0
    if provider == "openai":
        assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    else:
        assert body["system"] == "Be brief."
        assert body["max_tokens"] == 1024


def test_shorthand_names_build_provider_models() -> None:
    bot = harness.Agent(name="short", model="openai:gpt-4.1-mini")
    assert isinstance(bot.model, harness.OpenAIModel)
    assert bot.model.name == "openai:gpt-4.1-mini"
    other = harness.Agent(name="short2", model="anthropic:claude-sonnet-4-5")
    assert isinstance(other.model, harness.AnthropicModel)
    with pytest.raises(ConfigError, match="expected 'openai:MODEL', 'anthropic:MODEL'"):
        harness.Agent(name="short3", model="gemini:pro")


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(ConfigError) as err:
        harness.AnthropicModel("claude-test")
    assert "pip install -e '.[anthropic]' in the harness's clone" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_api_key_fails_the_run_with_the_sdks_words(
    wire: WireServer, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    agent("openai")
    run_id = run(rig, "no key")
    failed = rig.load(run_id)
    assert failed.status is RunStatus.FAILED
    assert "OPENAI_API_KEY" in (failed.error or "")
    assert wire.requests == []


def test_retry_after_headers() -> None:
    assert retry_after({"retry-after": "2.5"}) == 2.5
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, lambda: 1445412470.0) == 10
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


def test_retry_delay_backs_off_exponentially_with_jitter_and_a_cap() -> None:
    for n in range(10):
        delay = retry_delay(n, None)
        assert min(60.0, 2.0**n) / 2 <= delay <= min(60.0, 2.0**n)
    assert 30 <= retry_delay(0, 30.0) <= 33


def test_prices_reject_bad_tables() -> None:
    with pytest.raises(ConfigError, match="is not JSON"):
        Prices.parse("{")
    with pytest.raises(ConfigError, match="needs 'input' and 'output'"):
        Prices.parse('{"m": {"input": 1}}')
    with pytest.raises(ConfigError, match="unknown"):
        Prices.parse('{"m": {"input": 1, "output": 2, "cheap": 0}}')
    with pytest.raises(ConfigError, match="must be a finite number"):
        Prices.parse('{"m": {"input": -1, "output": 2}}')
    usage = harness.Usage(1_000_000, 0)
    assert Prices.parse('{"gpt-x": {"input": 1, "output": 2}}').cost("openai:gpt-x", usage) == 1.0


def test_a_duplicate_message_mid_call_does_not_buy_the_turn_twice(
    wire: WireServer, rig: Rig
) -> None:
    """Without Redis too: a paid model step holds the lease while it calls, so a
    second copy of its message (a nudge, a redelivery) is dropped."""
    agent("openai")
    wire.script("nudged", [{"text": "once", "faults": [{"delay": 2.0}]}])
    run_id = create_run(rig.runtime(), "bot", "nudged")
    rig.sent.append((run_id, 0))  # `tasks.run_step.delay(run_id)` while it runs
    outcomes: list[TaskResult] = []
    thread = threading.Thread(target=lambda: outcomes.extend(rig.drive(limit=1)))
    thread.start()
    wire_seen = time.monotonic() + 5
    while wire.calls("nudged", 0) == 0 and time.monotonic() < wire_seen:
        time.sleep(0.01)
    second = run_step(rig.runtime("w2"), run_id, 0)
    thread.join()
    assert (outcomes, second) == ([TaskResult.COMPLETED], TaskResult.LEASED)
    assert (wire.calls("nudged", 0), wire.billed("nudged", 0)) == (1, 1)


def test_a_blank_text_beside_tool_calls_is_not_sent_back_to_anthropic(
    wire: WireServer, rig: Rig
) -> None:
    agent("anthropic")
    wire.script(
        "blank",
        [
            {"text": "\n\n", "tool_calls": [{"name": "weather", "args": {"city": "Rome"}}]},
            {"text": "ok"},
        ],
    )
    run_id = run(rig, "blank")
    assert rig.load(run_id).status is RunStatus.COMPLETED, rig.load(run_id).error
    assistant = wire.requests[-1].body["messages"][1]
    assert [b["type"] for b in assistant["content"]] == ["tool_use"]


def test_extended_thinking_is_refused_until_its_blocks_are_kept() -> None:
    with pytest.raises(ConfigError, match="extended thinking is not supported"):
        harness.AnthropicModel("claude-test", thinking={"type": "enabled", "budget_tokens": 1024})


def test_long_waits_are_left_to_the_sweeper_and_never_on_rabbitmq() -> None:
    redis_broker = Settings.from_env({"HARNESS_BROKER_URL": "redis://localhost:6379/0"})
    rabbit = Settings.from_env({"HARNESS_BROKER_URL": "amqp://guest:guest@localhost//"})
    assert sends_delayed(redis_broker.broker_url, 30.0)
    assert not sends_delayed(redis_broker.broker_url, 600.0)
    assert not sends_delayed(rabbit.broker_url, 1.0)
    assert step_options("r1", 2, "harness", delay=30.0)["countdown"] == 30.0


def test_a_huge_retry_after_is_capped() -> None:
    assert retry_delay(0, 1e12) <= 3600 * 1.1
    assert retry_delay(5000, None) <= 60.0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_sdks_own_retries_are_off(provider: str, wire: WireServer) -> None:
    """Retrying is the harness's job (durable, in SQL): one request per attempt."""
    client = model_for(provider).client()
    assert client.max_retries == 0
    client.close()


def test_threads_share_one_client_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threads pool's first steps all ask for the client at once: one is made
    (one HTTP connection pool for the process), and every thread gets it."""
    model = harness.OpenAIModel("gpt-test")
    made: list[object] = []

    def make() -> object:
        time.sleep(0.05)  # long enough for every thread to arrive meanwhile
        made.append(object())
        return made[-1]

    monkeypatch.setattr(model, "_make_client", make)
    barrier = threading.Barrier(16)
    got: list[object] = []

    def ask() -> None:
        barrier.wait(timeout=10)
        got.append(model.client())

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(made) == 1
    assert got == [made[0]] * 16


def test_the_fields_sent_verbatim_are_what_the_sdks_own_transform_would_send(
    wire: WireServer, rig: Rig
) -> None:
    """OpenAI's messages and tools go in ``extra_body``, past the SDK's
    transform of its arguments (ProviderModel.verbatim): that transform must
    have had nothing to change in them, on the SDK installed, or a newer
    SDK's renaming would be skipped. (Anthropic's SDK has no such transform.)"""
    from openai._utils import maybe_transform
    from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

    agent("openai")
    wire.script("two cities", TWO_CITIES)
    run_id = run(rig, "two cities")
    assert rig.load(run_id).status is RunStatus.COMPLETED
    bodies = [r.body for r in wire.requests]
    assert len(bodies) == 2 and all(b["tools"] and b["messages"] for b in bodies)
    for body in bodies:
        sent = {k: body[k] for k in harness.OpenAIModel.verbatim}
        assert maybe_transform(sent, CompletionCreateParamsStreaming) == sent
