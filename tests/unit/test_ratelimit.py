"""Rate limits: parsing the table, and the sliding window's script.

The script runs on fakeredis's Lua (the one Redis runs, lupa) with the time moved by
hand (the limiter's ``clock``): no Redis server and no waiting. Many workers racing on
one real Redis, with Redis's own clock, is tests/integration/test_ratelimit_redis.py.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import fakeredis
import pytest
import redis

from harness.errors import ConfigError
from harness.providers.ratelimit import (
    SUB_BUCKETS,
    Grant,
    Limits,
    RateLimiter,
    limits_for,
    parse_limits,
)
from tests.rig import FakeClock

URL = "redis://127.0.0.1:6379/0"  # never connected to: only parsed
WINDOW = 1.2
REQ = "harness:rate:p:m:req"
TOK = "harness:rate:p:m:tok"


def test_parse_the_documented_example() -> None:
    table = parse_limits(
        "openai:gpt-4.1-mini=500rpm/200000tpm; anthropic:*=50rpm; openai:*=100000tpm"
    )
    assert table == {
        ("openai", "gpt-4.1-mini"): Limits(requests=500, tokens=200000),
        ("anthropic", "*"): Limits(requests=50),
        ("openai", "*"): Limits(tokens=100000),
    }


def test_parse_ignores_whitespace_and_empty_entries() -> None:
    table = parse_limits(" ; p : m = 5 tpm / 3rpm ;;\n q:ft:gpt-4o:org:x=1RPM; ")
    assert table == {("p", "m"): Limits(3, 5), ("q", "ft:gpt-4o:org:x"): Limits(requests=1)}
    assert parse_limits("") == {} and parse_limits(" ; ") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("openai=5rpm", "'openai=5rpm' is not PROVIDER:MODEL=LIMIT"),
        ("openai:gpt", "'openai:gpt' is not PROVIDER:MODEL=LIMIT"),
        (":gpt=5rpm", "':gpt=5rpm' is not PROVIDER:MODEL=LIMIT"),
        ("openai:=5rpm", "'openai:=5rpm' is not PROVIDER:MODEL=LIMIT"),
        ("*:*=5rpm", "the provider cannot be '*'"),
        ("openai:gpt=", "'' is not <n>rpm or <n>tpm"),
        ("openai:gpt=5rps", "'5rps' is not <n>rpm or <n>tpm"),
        ("openai:gpt=-5rpm", "'-5rpm' is not <n>rpm or <n>tpm"),
        ("openai:gpt=5rpm/", "'' is not <n>rpm or <n>tpm"),
        ("openai:gpt=0tpm", "'0tpm' must be positive"),
        ("openai:gpt=5rpm/6rpm", "rpm is given more than once"),
        ("openai:gpt=5rpm; openai:gpt=6tpm", "openai:gpt is given more than once"),
    ],
)
def test_parse_rejects_with_a_useful_message(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^HARNESS_RATE_LIMITS: ") as err:
        parse_limits(text)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_most_specific_entry_wins_per_kind() -> None:
    table = parse_limits("openai:gpt-a=500rpm; openai:*=9rpm/100000tpm; anthropic:c=7tpm")
    assert limits_for(table, "openai", "gpt-a") == Limits(requests=500, tokens=100000)
    assert limits_for(table, "openai", "gpt-b") == Limits(requests=9, tokens=100000)
    assert limits_for(table, "anthropic", "c") == Limits(tokens=7)
    assert limits_for(table, "anthropic", "d") == Limits()
    assert limits_for(table, "other", "gpt-a") == Limits()


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    """A Redis of this test's own, in the process (fakeredis runs the scripts' Lua)."""
    c = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield c
    c.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def limiter(
    client: redis.Redis, limits: str, clock: FakeClock, window: float = WINDOW
) -> RateLimiter:
    return RateLimiter(client, parse_limits(limits), window, clock=clock.now)


def counted(client: redis.Redis, key: str) -> int:
    return sum(int(v) for v in client.hgetall(key).values())


def test_admits_up_to_the_limit_then_waits_without_taking(
    client: redis.Redis, clock: FakeClock
) -> None:
    rl = limiter(client, "p:m=3rpm", clock)
    grants = [rl.acquire("p", "m", 10) for _ in range(3)]
    assert all(g.wait == 0.0 and g.reserved_tokens == 0 and g.bucket for g in grants)
    assert counted(client, REQ) == 3
    denied = rl.acquire("p", "m", 10)
    assert denied.reserved_tokens == 0 and denied.bucket is None
    assert 0.0 < denied.wait <= WINDOW * rl.span / SUB_BUCKETS + 1e-6  # to the microsecond
    assert counted(client, REQ) == 3
    assert not client.exists(TOK)
    assert 0 < client.pttl(REQ) <= rl._ttl_ms


def test_waiting_the_answer_is_enough(client: redis.Redis, clock: FakeClock) -> None:
    rl = limiter(client, "p:*=3rpm", clock)
    for _ in range(2):
        assert rl.acquire("p", "m", 0).wait == 0.0
    first_fields = set(client.hkeys(REQ))
    clock.advance(0.4)
    assert rl.acquire("p", "m", 0).wait == 0.0
    wait = rl.acquire("p", "m", 0).wait
    # The two oldest must leave: at most WINDOW * span/60 - 0.4 s from now.
    assert 0.2 < wait <= WINDOW * rl.span / SUB_BUCKETS - 0.4 + 1e-6
    clock.advance(wait)
    assert rl.acquire("p", "m", 0).wait == 0.0
    clock.advance(2 * WINDOW / SUB_BUCKETS)
    assert rl.acquire("p", "m", 0).wait == 0.0
    assert rl.acquire("p", "m", 0).wait > 0.0
    assert counted(client, REQ) == 3
    assert not first_fields & set(client.hkeys(REQ)), "expired sub-buckets are deleted"
    assert not client.exists("harness:rate:p:*:req")


@pytest.mark.parametrize(("window", "arrival"), [(60.0, 0.5), (2.0, 0.5), (0.3, 0.5), (2.0, 0.0)])
def test_the_counted_span_allows_for_the_trip_to_the_provider(
    client: redis.Redis, window: float, arrival: float
) -> None:
    """A request admitted at the very end of a sub-bucket and arriving `arrival` s later
    is still counted by every later admission for a whole window after its arrival; the
    key outlives the last counted sub-bucket."""
    rl = RateLimiter(client, parse_limits("p:m=1rpm"), window, arrival)
    width = window / SUB_BUCKETS
    assert rl.span * width >= window + width + max(arrival, width) - 1e-9
    assert rl.span * width < window + 3 * width + arrival
    assert rl._ttl_ms / 1000 >= rl.span * width


def test_requests_and_tokens_are_checked_together(client: redis.Redis, clock: FakeClock) -> None:
    rl = limiter(client, "p:m=5rpm; p:*=100tpm", clock)
    assert rl.acquire("p", "m", 80).reserved_tokens == 80
    denied = rl.acquire("p", "m", 30)
    assert denied.wait > 0.0 and denied.reserved_tokens == 0
    assert (counted(client, REQ), counted(client, TOK)) == (1, 80)
    for _ in range(4):
        assert rl.acquire("p", "m", 5).wait == 0.0
    denied = rl.acquire("p", "m", 0)
    assert denied.wait > 0.0
    assert (counted(client, REQ), counted(client, TOK)) == (5, 100)


def test_settle_corrects_the_token_count(client: redis.Redis, clock: FakeClock) -> None:
    rl = limiter(client, "p:m=100tpm", clock)
    grant = rl.acquire("p", "m", 80)
    assert grant.reserved_tokens == 80 and grant.bucket is not None
    rl.settle("p", "m", grant.reserved_tokens, 30, grant.bucket)
    assert client.hgetall(TOK) == {str(grant.bucket).encode(): b"30"}
    assert rl.acquire("p", "m", 70).wait == 0.0
    assert rl.acquire("p", "m", 1).wait > 0.0
    rl.settle("p", "m", 70, 75)
    assert counted(client, TOK) == 105
    rl.settle("p", "m", 10, 5)
    assert counted(client, TOK) == 100
    rl.settle("p", "m", 10, 10)
    assert counted(client, TOK) == 100


def test_settle_without_a_token_limit_does_nothing(client: redis.Redis, clock: FakeClock) -> None:
    rl = limiter(client, "p:m=5rpm", clock)
    grant = rl.acquire("p", "m", 80)
    assert grant == Grant(0.0, 0, grant.bucket)
    rl.settle("p", "m", grant.reserved_tokens, 500, grant.bucket)
    assert not client.exists(TOK)


def test_settle_into_a_bucket_that_left_the_window_is_dropped(
    client: redis.Redis, clock: FakeClock
) -> None:
    rl = limiter(client, "p:m=100tpm", clock, window=0.3)
    grant = rl.acquire("p", "m", 50)
    clock.advance(0.3 * rl.span / SUB_BUCKETS + 0.02)
    rl.settle("p", "m", 50, 10, grant.bucket)
    assert client.hgetall(TOK) == {str(grant.bucket).encode(): b"50"}


def test_one_acquisition_above_the_limit_needs_an_empty_window(
    client: redis.Redis, clock: FakeClock
) -> None:
    rl = limiter(client, "p:m=100tpm", clock, window=0.6)
    grant = rl.acquire("p", "m", 150)
    assert (grant.wait, grant.reserved_tokens) == (0.0, 150)
    assert counted(client, TOK) == 150
    assert rl.acquire("p", "m", 1).wait > 0.0
    denied = rl.acquire("p", "m", 150)
    assert 0.0 < denied.wait <= 0.6 * rl.span / SUB_BUCKETS + 1e-6
    clock.advance(denied.wait)
    assert rl.acquire("p", "m", 150).reserved_tokens == 150
    assert counted(client, TOK) == 150


QUEUE = "harness:rate:p:m:queue"


def test_a_waiting_holder_keeps_its_room_from_those_after_it(
    client: redis.Redis, clock: FakeClock
) -> None:
    rl = limiter(client, "p:m=100tpm", clock, window=0.3)
    assert rl.acquire("p", "m", 60, ticket="small-1").wait == 0.0
    first = rl.acquire("p", "m", 70, ticket="big-1")
    assert first.wait > 0.0 and client.hexists(QUEUE, "big-1")
    # 60 + 40 would fit, but 70 are held for big-1: a later request waits behind it.
    assert rl.acquire("p", "m", 40, ticket="small-2").wait > 0.0
    assert rl.acquire("p", "m", 30).wait > 0.0  # without a ticket too
    assert rl.acquire("p", "m", 50, ticket="big-2").wait > 0.0
    assert counted(client, TOK) == 60
    clock.advance(first.wait)
    # The window is empty, and big-1 goes first, though small-2 came back as soon.
    assert rl.acquire("p", "m", 40, ticket="small-2").wait > 0.0
    assert rl.acquire("p", "m", 70, ticket="big-1").wait == 0.0
    assert not client.hexists(QUEUE, "big-1")
    assert counted(client, TOK) == 70
    assert set(client.hkeys(QUEUE)) == {b"small-2", b"big-2"}
    # A newcomer counts every hold: 70 taken and 90 held leave no room for 10.
    assert rl.acquire("p", "m", 10).wait > 0.0


def test_two_large_holders_do_not_block_each_other(client: redis.Redis, clock: FakeClock) -> None:
    """Each holder counts only the holds older than its own: 80 + 80 held under
    a limit of 100 is a queue, not a deadlock."""
    rl = limiter(client, "p:m=100tpm", clock, window=0.3)
    assert rl.acquire("p", "m", 50, ticket="a").wait == 0.0
    waits = [rl.acquire("p", "m", 80, ticket=t).wait for t in ("b", "c")]
    assert all(w > 0 for w in waits)
    admitted: list[str] = []
    for _ in range(20):
        for ticket in ("c", "b"):  # the later one asks first each time
            if ticket not in admitted and rl.acquire("p", "m", 80, ticket=ticket).wait == 0.0:
                admitted.append(ticket)
        if len(admitted) == 2:
            break
        clock.advance(0.3 * rl.span / SUB_BUCKETS / 2)
    assert admitted == ["b", "c"]


def test_a_hold_whose_holder_never_returns_lapses(client: redis.Redis, clock: FakeClock) -> None:
    rl = limiter(client, "p:m=100tpm", clock, window=0.3)
    assert rl.acquire("p", "m", 60, ticket="a").wait == 0.0
    ghost = rl.acquire("p", "m", 70, ticket="ghost")
    assert ghost.wait > 0.0
    span = 0.3 * rl.span / SUB_BUCKETS
    clock.advance(ghost.wait * 1.25 + span + 0.05)
    assert rl.acquire("p", "m", 90, ticket="other").wait == 0.0
    assert not client.hexists(QUEUE, "ghost")


def test_a_withdrawn_hold_frees_its_room_at_once(client: redis.Redis, clock: FakeClock) -> None:
    rl = limiter(client, "p:m=100tpm", clock, window=60.0)
    assert rl.acquire("p", "m", 60, ticket="a").wait == 0.0
    assert rl.acquire("p", "m", 70, ticket="late").wait > 0.0
    assert rl.acquire("p", "m", 30).wait > 0.0
    rl.withdraw("p", "m", "late")
    assert rl.acquire("p", "m", 30).wait == 0.0


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_limit_admits_without_touching_redis() -> None:
    dead = redis.Redis(port=_unused_port(), socket_timeout=0.2, socket_connect_timeout=0.2)
    rl = RateLimiter(dead, parse_limits("p:m=1rpm"), WINDOW)
    assert rl.acquire("p", "other", 10**9) == Grant(0.0, 0)
    rl.settle("p", "other", 0, 10)
    dead.close()


def test_redis_down_admits_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://127.0.0.1:{_unused_port()}/0"
    rl = RateLimiter.from_settings(url, "p:m=1rpm/5tpm", WINDOW, timeout=0.2)
    assert rl is not None
    # A dead Redis must not hold a step for long: short timeouts, two quick retries.
    settings = rl.client.connection_pool.connection_kwargs
    assert (settings["socket_timeout"], settings["socket_connect_timeout"]) == (0.2, 0.2)
    assert rl.client.get_retry().get_retries() == 2
    with caplog.at_level(logging.WARNING, logger="harness.providers.ratelimit"):
        assert rl.acquire("p", "m", 3) == Grant(0.0, 0)
        assert rl.acquire("p", "m", 3) == Grant(0.0, 0)
        rl.settle("p", "m", 0, 4)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "rate limit of p:m not checked, Redis failed" in messages[0]
    assert "token usage of p:m not settled, Redis failed" in messages[2]
    rl.close()


def test_from_settings() -> None:
    assert RateLimiter.from_settings(None, "") is None
    assert RateLimiter.from_settings(URL, "  ;  ") is None
    with pytest.raises(ConfigError, match="HARNESS_RATE_LIMITS needs HARNESS_REDIS_URL"):
        RateLimiter.from_settings(None, "p:m=5rpm")
    with pytest.raises(ConfigError, match="HARNESS_RATE_LIMITS: 'p:m=5': '5' is not"):
        RateLimiter.from_settings(URL, "p:m=5")
    with pytest.raises(ConfigError, match="HARNESS_REDIS_URL='nowhere'"):
        RateLimiter.from_settings("nowhere", "p:m=5rpm")
    with pytest.raises(ConfigError, match=r"HARNESS_RATE_WINDOW=0\.0 must be a positive number"):
        RateLimiter.from_settings(URL, "p:m=5rpm", window=0.0)
    rl = RateLimiter.from_settings(URL, "p:m=5rpm", window=2.0)
    assert rl is not None and rl.window == 2.0
    assert rl.table == {("p", "m"): Limits(requests=5)}
    rl.close()
