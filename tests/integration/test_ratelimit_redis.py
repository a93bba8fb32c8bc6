"""Rate limits on a real Redis: its Lua and its clock, and many workers at once.

The script's arithmetic is tested in tests/unit/test_ratelimit.py on fakeredis with a
hand-moved clock; here it runs where it runs in production (Redis's ``TIME``, one
Redis shared by threads and processes), which no fake can vouch for.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier

import pytest
import redis

from harness.providers.ratelimit import SUB_BUCKETS, RateLimiter, parse_limits
from tests.services import REDIS_LIMIT_DB, REDIS_URL, require

pytestmark = pytest.mark.redis

URL = f"{REDIS_URL}/{REDIS_LIMIT_DB}"
WINDOW = 1.2
REQ = "harness:rate:p:m:req"
TOK = "harness:rate:p:m:tok"


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    require("redis")
    c = redis.Redis.from_url(URL)
    c.flushdb()
    yield c
    c.close()


def limiter(client: redis.Redis, limits: str, window: float = WINDOW) -> RateLimiter:
    return RateLimiter(client, parse_limits(limits), window)


def counted(client: redis.Redis, key: str) -> int:
    return sum(int(v) for v in client.hgetall(key).values())


def test_admits_up_to_the_limit_then_waits_without_taking(client: redis.Redis) -> None:
    rl = limiter(client, "p:m=3rpm")
    grants = [rl.acquire("p", "m", 10) for _ in range(3)]
    assert all(g.wait == 0.0 and g.reserved_tokens == 0 and g.bucket for g in grants)
    assert counted(client, REQ) == 3
    denied = rl.acquire("p", "m", 10)
    assert denied.reserved_tokens == 0 and denied.bucket is None
    assert 0.0 < denied.wait <= WINDOW * rl.span / SUB_BUCKETS + 0.1
    assert counted(client, REQ) == 3
    assert not client.exists(TOK)
    assert 0 < client.pttl(REQ) <= rl._ttl_ms


STARVE_WINDOW = 0.6
STARVE_LIMITS = "p:m=300tpm"


def test_a_large_request_is_not_starved_by_small_looping_ones(client: redis.Redis) -> None:
    """The review's case scaled down (3,000 tpm in a 3 s window, 12 small looping
    runs, one asking ~2,300): 300 tokens per 0.6 s, twelve requesters of 30-52
    tokens that ask again as soon as admitted, or the moment they are told room
    will be there, and one of 230 that returns a little later than told, as a
    rescheduled step does. It is admitted within a few of its tries: behind at
    most one request of each small requester (about two windows' worth), not
    for ever."""
    stop = threading.Event()

    def small(seed: int) -> None:
        own = redis.Redis.from_url(URL)
        rl = limiter(own, STARVE_LIMITS, STARVE_WINDOW)
        step = 0
        while not stop.is_set():
            grant = rl.acquire("p", "m", 30 + 2 * seed, ticket=f"small-{seed}:{step}")
            if grant.wait > 0:
                stop.wait(grant.wait)
            else:
                step += 1
        own.close()

    threads = [threading.Thread(target=small, args=(seed,)) for seed in range(12)]
    for thread in threads:
        thread.start()
    try:
        stop.wait(STARVE_WINDOW)  # the window full of small requests
        rl = limiter(client, STARVE_LIMITS, STARVE_WINDOW)
        denied = 0
        while denied < 12:
            grant = rl.acquire("p", "m", 230, ticket="large:0")
            if grant.wait == 0.0:
                break
            denied += 1
            time.sleep(grant.wait * random.uniform(1.0, 1.2))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert denied <= 6, f"the large request was turned away {denied} times"


HAMMER_WINDOW = 0.5
HAMMER_LIMITS = "p:m=8rpm/60tpm"


def _hammer(
    barrier: Barrier, seed: int, out: multiprocessing.Queue[list[tuple[float, int]]]
) -> None:
    """One worker: acquire as fast as allowed for ~3 windows; the wall time of each admission."""
    client = redis.Redis.from_url(URL)
    # Admissions are what is counted here: no allowance for a trip to a provider.
    rl = RateLimiter(client, parse_limits(HAMMER_LIMITS), HAMMER_WINDOW, arrival=0.0)
    admitted: list[tuple[float, int]] = []
    barrier.wait(timeout=15)
    deadline = time.time() + 3 * HAMMER_WINDOW
    i = seed
    while time.time() < deadline:
        tokens = 1 + (i * 7) % 12
        i += 1
        grant = rl.acquire("p", "m", tokens)
        if grant.wait == 0.0:
            admitted.append((time.time(), tokens))
        else:
            time.sleep(grant.wait)
    client.close()
    out.put(admitted)


def test_no_window_sees_more_than_the_limit_under_concurrency(client: redis.Redis) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    out: multiprocessing.Queue[list[tuple[float, int]]] = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(barrier, seed, out)) for seed in range(4)]
    for p in procs:
        p.start()
    try:
        admitted = sorted(a for _ in procs for a in out.get(timeout=20))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    assert all(p.exitcode == 0 for p in procs)
    limits = parse_limits(HAMMER_LIMITS)[("p", "m")]
    assert limits.requests is not None and limits.tokens is not None
    w = HAMMER_WINDOW

    def over(span: list[tuple[float, int]]) -> bool:
        assert limits.requests is not None and limits.tokens is not None
        return len(span) > limits.requests or sum(n for _, n in span) > limits.tokens

    by_calendar: dict[int, list[tuple[float, int]]] = {}
    for t, n in admitted:
        by_calendar.setdefault(int(t // w), []).append((t, n))
    bad = {k: v for k, v in by_calendar.items() if over(v)}
    assert not bad, f"calendar windows over the limit: {bad}"
    for start, _ in admitted:
        span = [(t, n) for t, n in admitted if start <= t < start + w]
        assert not over(span), f"the window from {start} is over the limit: {span}"
    # Not trivially safe: about a full window's worth was admitted in each of the ~3 windows.
    assert len(admitted) >= 2 * limits.requests
