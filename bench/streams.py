"""``python -m bench.streams``: what watching an answer costs (issue 24).

**Latency.** STREAMS runs on PostgreSQL, one ``harness serve`` process (the
API, uvicorn, one event loop) and Redis. A publisher process writes a piece
of text to each run's stream RATE times a second for SECONDS, through the
worker's own :class:`harness.streams.Tap` (so its coalescing counts), each
piece the time at which the "worker" received it. For every run, two
readers in this process take the pieces: one through the API's
``GET /api/runs/{id}/events`` (Server-Sent Events), one straight from the
same Redis stream (``XREAD BLOCK``, the least a reader can wait). Each piece
is timed from its receipt by the worker to its arrival at each reader:
p50 and p99 of both, and their ratio; and, for each piece both readers had,
how much later the SSE reader had it (what the API adds, whatever the
machine's load did to both).

**CPU.** A model step with a provider on the local wire-format server
(tests.wire: the OpenAI SDK, ~WORDS words of answer in 4-character
deltas, as the real API sends about a token each), executed by the real
engine in this thread (tests.rig's runtime, PostgreSQL store, the Redis
stream): the thread's CPU time per step (``time.thread_time``: the server
runs in other threads) streamed, as every call is, against the same step
with the call made unstreamed (``stream=False``, one JSON response),
interleaved rounds, median.

A measurement, not a test: it prints the figures and the ratios.

    python -m bench.streams [--streams 100] [--seconds 10] [--rate 20] [--steps 200]
                            [--database URL] [--redis URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import redis
import redis.asyncio

import harness
from bench.common import REPO, fresh_postgres
from harness.engine import transitions
from harness.engine.creation import create_run
from harness.models import ModelTurn, Usage
from harness.store.sql import SQLStore
from harness.streams import RedisSink, Tap, stream_key
from tests.rig import Rig
from tests.wire import WireServer

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench_streams"
REDIS = "redis://127.0.0.1:6379/12"
TOKEN = "bench-streams"
WORDS = 150


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- latency -------------------------------------------------------------------------


def _publish(redis_url: str, keys: list[tuple[str, str]], seconds: float, rate: float) -> None:
    """The publisher process: a piece to every stream each 1/rate s, through a Tap."""
    sink = RedisSink(redis.Redis.from_url(redis_url), 3600.0)
    taps = [Tap(sink, run_id, lineage, 0, 1) for run_id, lineage in keys]
    start = time.time()
    tick = 0
    while time.time() < start + seconds:
        for tap in taps:
            tap(f"{time.time():.6f};")
        tick += 1
        time.sleep(max(0.0, start + tick / rate - time.time()))
    for tap in taps:
        tap.close()


#: A reader's pieces: (run, the piece's stamp) -> milliseconds from the worker to the reader.
Arrivals = dict[tuple[str, str], float]


def _pieces(run_id: str, text: str, now: float, into: Arrivals) -> None:
    for stamp in text.split(";"):
        if stamp:
            into[run_id, stamp] = (now - float(stamp)) * 1000


async def _sse_reader(
    client: httpx.AsyncClient, run_id: str, into: Arrivals, ready: asyncio.Queue[str]
) -> None:
    async with client.stream("GET", f"/api/runs/{run_id}/events") as response:
        response.raise_for_status()
        event = None
        async for line in response.aiter_lines():
            if line.startswith("event: step"):
                ready.put_nowait(run_id)  # the run's creation: the reader is under way
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "token":
                _pieces(run_id, json.loads(line[6:])["text"], time.time(), into)


async def _redis_reader(client: redis.asyncio.Redis, run_id: str, key: str, into: Arrivals) -> None:
    last = "0"
    while True:
        answer: Any = await client.xread({key: last}, block=1000)
        now = time.time()
        for entry_id, fields in answer[0][1] if answer else ():
            last = entry_id.decode()
            _pieces(run_id, json.loads(fields[b"e"])[3], now, into)


@contextlib.contextmanager
def _api(port: int, url: str, redis_url: str) -> Iterator[str]:
    env = {
        **os.environ,
        "HARNESS_DATABASE_URL": url,
        "HARNESS_REDIS_URL": redis_url,
        "HARNESS_API_TOKEN": TOKEN,
        "HARNESS_LOG_FORMAT": "text",
    }
    harness_cli = str(REPO / ".venv" / "bin" / "harness")
    process = subprocess.Popen(
        [harness_cli, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("harness serve did not start")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Latency:
    streams: int
    pieces: int
    sse: Arrivals
    direct: Arrivals

    def added(self) -> list[float]:
        """For each piece both readers had: how much later the SSE reader had it."""
        return [at - self.direct[piece] for piece, at in self.sse.items() if piece in self.direct]


def latency(
    streams: int, seconds: float, rate: float, url: str = URL, redis_url: str = REDIS
) -> Latency:
    fresh_postgres(url)
    redis.Redis.from_url(redis_url).flushdb()
    store = SQLStore.from_url(url)
    keys = []
    for n in range(streams):
        run, steps = transitions.new_run(f"stream-{n}", "bench", "watch", time.time())
        created, _ = store.create_run(run, steps, run.created_at + 30, transitions.created(run))
        keys.append((created.run_id, created.lineage))
    store.close()
    sse: Arrivals = {}
    direct: Arrivals = {}
    with _api(_free_port(), url, redis_url) as base:

        async def read() -> None:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            limits = httpx.Limits(max_connections=streams + 10)
            async with httpx.AsyncClient(
                base_url=base, headers=headers, timeout=None, limits=limits
            ) as client:
                direct_client = redis.asyncio.Redis.from_url(redis_url)
                ready: asyncio.Queue[str] = asyncio.Queue()
                tasks = [
                    asyncio.create_task(_sse_reader(client, run_id, sse, ready))
                    for run_id, _ in keys
                ] + [
                    asyncio.create_task(_redis_reader(direct_client, k[0], stream_key(*k), direct))
                    for k in keys
                ]
                for _ in keys:  # every reader under way first
                    await asyncio.wait_for(ready.get(), 60)
                publisher = multiprocessing.get_context("spawn").Process(
                    target=_publish, args=(redis_url, keys, seconds, rate)
                )
                publisher.start()
                await asyncio.to_thread(publisher.join)
                await asyncio.sleep(2.0)  # the last pieces arrive
                for task in tasks:
                    task.cancel()
                for failed in await asyncio.gather(*tasks, return_exceptions=True):
                    if isinstance(failed, Exception):
                        raise failed
                await direct_client.aclose()

        asyncio.run(read())
    return Latency(streams, int(streams * seconds * rate), sse, direct)


# -- CPU --------------------------------------------------------------------------------


class Unstreamed(harness.OpenAIModel):
    """The same call unstreamed: one JSON response (the baseline, not a feature)."""

    def streaming(self, known: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def _send(
        self,
        method: Callable[..., Any],
        known: dict[str, Any],
        timeout: float,
        on_text: Callable[[str], None] | None,
    ) -> ModelTurn:
        completion = method(**known, timeout=timeout)
        choice = completion.choices[0]
        usage = Usage(completion.usage.prompt_tokens, completion.usage.completion_tokens)
        return ModelTurn(
            final=choice.message.content, usage=usage, stop_reason=choice.finish_reason
        )


@dataclass
class Cpu:
    steps: int
    streamed_ms: float
    unstreamed_ms: float
    writes_per_step: float


def cpu(steps: int, rounds: int = 5, url: str = URL, redis_url: str = REDIS) -> Cpu:
    answer = " ".join(f"word{n % 97}" for n in range(WORDS))
    fresh_postgres(url)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    with WireServer(default=[{"text": answer}]) as wire:
        os.environ["OPENAI_BASE_URL"] = wire.openai_base_url
        os.environ["OPENAI_API_KEY"] = "bench"
        for name, model in (
            ("bench-streamed", harness.OpenAIModel("gpt-test", timeout=10)),
            ("bench-unstreamed", Unstreamed("gpt-test", timeout=10)),
        ):
            harness.register_agent(harness.Agent(name=name, model=model, tools=[]))
        store = SQLStore.from_url(url)
        rig = Rig(store, options={"streams": RedisSink(client, 3600.0)})
        rt = rig.runtime()
        per_step: dict[str, list[float]] = {"bench-streamed": [], "bench-unstreamed": []}
        for agent in per_step:  # warm-up: clients, connections, statements
            create_run(rt, agent, "warm up")
            rig.drive()
        for _ in range(rounds):
            for agent, timings in per_step.items():
                for n in range(steps):
                    create_run(rt, agent, f"answer {n}")
                began = time.thread_time()
                rig.drive(limit=10 * steps)
                timings.append((time.thread_time() - began) * 1000 / steps)
        writes = sum(client.xlen(k) for k in client.scan_iter("harness:stream:*"))
        store.close()
    streamed_steps = (rounds * steps) + 1
    return Cpu(
        steps,
        statistics.median(per_step["bench-streamed"]),
        statistics.median(per_step["bench-unstreamed"]),
        writes / streamed_steps,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=20.0, help="pieces a second per stream")
    parser.add_argument("--steps", type=int, default=200, help="model steps per CPU round")
    parser.add_argument("--database", default=URL, help="PostgreSQL URL (dropped, re-made)")
    parser.add_argument("--redis", default=REDIS, help="Redis URL (its database is emptied)")
    args = parser.parse_args()
    lat = latency(args.streams, args.seconds, args.rate, args.database, args.redis)
    print(f"latency, {lat.streams} streams, {lat.pieces} pieces to publish (as the publisher can):")
    for name, values in (
        ("SSE (API)", list(lat.sse.values())),
        ("direct XREAD", list(lat.direct.values())),
        ("SSE - direct", lat.added()),
    ):
        print(
            f"  {name:13} {len(values):7} pieces  p50 {_percentile(values, 0.5):6.2f} ms"
            f"  p99 {_percentile(values, 0.99):6.2f} ms  max {max(values):7.2f} ms"
        )
    p99 = _percentile(list(lat.sse.values()), 0.99)
    base = _percentile(list(lat.direct.values()), 0.99)
    print(
        f"  SSE p99 {p99:.2f} ms against direct p99 {base:.2f} ms: {p99 / base:.2f}x"
        " (goal: <= 50 ms)"
    )
    if args.steps <= 0:
        return
    c = cpu(args.steps, url=args.database, redis_url=args.redis)
    print(f"CPU per model step ({WORDS} words, {c.steps} steps a round, median of rounds):")
    print(f"  streamed   {c.streamed_ms:6.2f} ms ({c.writes_per_step:.1f} stream writes a step)")
    print(f"  unstreamed {c.unstreamed_ms:6.2f} ms")
    ratio = c.streamed_ms / c.unstreamed_ms
    print(f"  streamed against unstreamed: {ratio:.2f}x (goal: <= 1.10x)")


if __name__ == "__main__":
    sys.exit(main())
