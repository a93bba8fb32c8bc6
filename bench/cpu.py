"""``python -m bench.cpu``: where a step's CPU goes in the worker (issue 26).

    python -m bench.cpu [--broker redis|rabbitmq] [--steps 2000] [--profile]
                        [--agent bench-loop] [--agent bench-loop-read]

One worker of one prefork slot on Redis + PostgreSQL (or RabbitMQ), as
``bench.steps`` runs it. For the bare hop, the floor (``bench.floor_hop``)
the fast path's floor (``bench.fast_floor_hop``) and a step of each
``--agent`` (``bench-loop``; ``bench-loop-read``, every step on the fast
path) it prints the CPU time per step of the pool child
and of the worker's main process (the consumer, which fetches, hands over
and acks), read from ``/proc`` around the measured chain: no profiler runs
then, so the figures are the real cost.

With ``--profile`` the pool child then profiles a second run of the first agent with
cProfile on CPU time (``time.process_time``: a wait on a socket counts
nothing), started and stopped at task boundaries by this module's signal
handlers (the worker imports it: ``HARNESS_IMPORTS``), and the profile's CPU
is split by layer: the harness's own code, Celery/kombu/billiard,
SQLAlchemy, psycopg, redis-py, logging, JSON, other. A C function or a
standard-library one counts for the layer that called it. The shares are
then scaled to the unprofiled CPU per step, in tenths of a millisecond.
A measurement, not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery.signals import task_prerun, worker_process_init

#: Set in the worker's environment: where the pool child writes its profile.
PROFILE_DIR = "BENCH_CPU_PROFILE_DIR"
#: The step tasks a profile skips (warm-up), then the ones it covers.
PROFILE_SKIP = "BENCH_CPU_PROFILE_SKIP"
PROFILE_TASKS = "BENCH_CPU_PROFILE_TASKS"

_TICKS = os.sysconf("SC_CLK_TCK")


class _ChildProfile:
    """In the pool child: profile from task ``skip`` to task ``skip + count``."""

    def __init__(self, out: Path, skip: int, count: int) -> None:
        self.out, self.skip, self.count = out, skip, count
        self.seen = 0
        self.profiler = cProfile.Profile(time.process_time)
        self.began = 0.0

    def prerun(self, **_: Any) -> None:
        self.seen += 1
        if self.seen == self.skip + 1:
            self.began = time.process_time()
            self.profiler.enable()
        elif self.seen == self.skip + self.count + 1:
            self.profiler.disable()
            cpu = time.process_time() - self.began
            self.profiler.dump_stats(self.out / f"child-{os.getpid()}.prof")
            meta = {"tasks": self.count, "cpu_s": cpu}
            (self.out / f"child-{os.getpid()}.json").write_text(json.dumps(meta))


_profile: list[_ChildProfile] = []


@worker_process_init.connect
def _child_started(**_: Any) -> None:
    out = os.environ.get(PROFILE_DIR)
    if not out:
        return
    child = _ChildProfile(
        Path(out), int(os.environ.get(PROFILE_SKIP, "200")), int(os.environ[PROFILE_TASKS])
    )
    _profile.append(child)  # the signal keeps a weak reference to its receiver
    task_prerun.connect(child.prerun, weak=False)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


#: (layer, test on a function's file), the first that matches.
LAYERS: list[tuple[str, re.Pattern[str]]] = [
    ("logging", re.compile(r"/logging/")),
    ("json", re.compile(r"/json/")),
    ("psycopg", re.compile(r"/psycopg(_c|_pool|_binary)?/")),
    ("SQLAlchemy", re.compile(r"/sqlalchemy/")),
    ("redis-py", re.compile(r"/site-packages/redis/")),
    ("Celery, kombu, billiard", re.compile(r"/site-packages/(celery|kombu|billiard|vine|amqp)/")),
    ("harness", re.compile(r"/harness/")),
    ("bench (the agent's model and tool)", re.compile(r"/bench/")),
]
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages)|^<frozen|^~$|^<string>$")

Func = tuple[str, int, str]


def _own_layer(func: Func) -> str | None:
    """The layer of a function by its file; None for the standard library and C."""
    path = func[0]
    for name, test in LAYERS:
        if test.search(path):
            return name
    if _STDLIB.search(path):
        return None
    site = re.search(r"/site-packages/([^/]+)/", path)
    return site[1] if site else "other"


def attribute(stats: pstats.Stats) -> Counter[str]:
    """Each layer's CPU seconds: a function's own time goes to its layer; a
    C or standard-library function's to its callers', in proportion to the
    time each caller's calls took (recursively, up to a layer)."""
    raw: dict[Func, Any] = stats.stats  # type: ignore[attr-defined]
    shares: dict[Func, dict[str, float]] = {}

    def split(func: Func, seen: frozenset[Func]) -> dict[str, float]:
        """The layers a second of ``func``'s own time belongs to, as fractions."""
        if func in shares:
            return shares[func]
        layer = _own_layer(func)
        if layer is not None:
            return {layer: 1.0}
        callers = {c: e for c, e in raw.get(func, (0, 0, 0, 0, {}))[4].items() if c not in seen}
        total = sum(edge[3] for edge in callers.values())
        out: dict[str, float] = {}
        if not callers or total <= 0:
            out = {"python (standard library, uncalled)": 1.0}
        else:
            for caller, edge in callers.items():
                for name, part in split(caller, seen | {func}).items():
                    out[name] = out.get(name, 0.0) + part * edge[3] / total
        shares[func] = out
        return out

    result: Counter[str] = Counter()
    for func, (_, _, own, _, _) in raw.items():
        for name, part in split(func, frozenset()).items():
            result[name] += own * part
    return result


def hot(stats: pstats.Stats, layer: str, top: int = 12) -> list[tuple[float, str]]:
    """The functions of ``layer`` with the most cumulative time."""
    raw: dict[Func, Any] = stats.stats  # type: ignore[attr-defined]
    rows = [
        (entry[3], f"{func[2]} ({re.sub(r'^.*/(site-packages|harness)/', '', func[0])})")
        for func, entry in raw.items()
        if _own_layer(func) == layer
    ]
    return sorted(rows, reverse=True)[:top]


def per_step(
    procs: tuple[int, int], run: Callable[[], float], steps: int
) -> tuple[float, float, float]:
    """(wall ms, child CPU ms, main process CPU ms) per step of ``run()``,
    which returns its wall ms per step."""
    parent, child = procs
    before = cpu_seconds(child), cpu_seconds(parent)
    wall = run()
    after = cpu_seconds(child), cpu_seconds(parent)
    return wall, (after[0] - before[0]) * 1000 / steps, (after[1] - before[1]) * 1000 / steps


@dataclass
class Measured:
    """Per step of each chain: (wall ms, pool child CPU ms, main process CPU
    ms); with a profile, the first agent's child CPU split by layer (ms a
    step, scaled to the unprofiled figure) and the profile itself."""

    broker: str
    steps: int
    rows: dict[str, tuple[float, float, float]]
    layers: Counter[str] = field(default_factory=Counter)
    profiled_ms: float = 0.0
    stats: pstats.Stats | None = None


def measure(broker: str, n: int, agents: tuple[str, ...], profile: bool) -> Measured:
    """One worker of one prefork slot: the bare hop, the floor, the fast
    path's floor and a run of each of ``agents``, ``n`` steps each; with
    ``profile``, a second run of ``agents[0]`` under cProfile in the child."""
    from bench.common import Setup, wait
    from bench.steps import bare_hops, floor_hops, harness_steps

    out = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    # Tasks before the profiled ones: the warm-up chains and the measured ones.
    skip = 200 + 201 * len(agents) + 200 + 200 + n * (3 + len(agents))
    env = {"HARNESS_IMPORTS": "bench.agents,bench.cpu"}
    if profile:
        env |= {PROFILE_DIR: str(out), PROFILE_SKIP: str(skip), PROFILE_TASKS: str(n)}
    fast = "bench.fast_floor_hop"
    try:
        with Setup(broker, **env) as setup:
            worker = setup.worker("--concurrency", "1")
            (child,) = worker.children()
            procs = (worker.pid, child)
            bare_hops(setup, 200)
            for agent in agents:
                harness_steps(agent, 201)
            floor_hops(setup, 200)
            floor_hops(setup, 200, task=fast)
            rows = {
                "bare hop": per_step(procs, lambda: bare_hops(setup, n), n),
                "floor": per_step(procs, lambda: floor_hops(setup, n), n),
                "fast floor": per_step(procs, lambda: floor_hops(setup, n, task=fast), n),
            }
            for agent in agents:
                run = functools.partial(lambda a: harness_steps(a, n).ms_per_step, agent)
                rows[agent] = per_step(procs, run, n)
            measured = Measured(broker, n, rows)
            if profile:
                harness_steps(agents[0], n + 200)  # a margin: probes and sweeps are tasks too
                wait(lambda: (out / f"child-{child}.json").exists(), what="the child's profile")
        if profile:
            stats = pstats.Stats(str(out / f"child-{child}.prof"))
            meta = json.loads((out / f"child-{child}.json").read_text())
            layers = attribute(stats)
            total = sum(layers.values())
            real = rows[agents[0]][1]
            measured.layers = Counter({k: v / total * real for k, v in layers.items()})
            measured.profiled_ms = meta["cpu_s"] * 1000 / meta["tasks"]
            measured.stats = stats
        return measured
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--agent", action="append", help="bench-loop (default), bench-loop-read")
    args = parser.parse_args()
    agents = tuple(args.agent or ["bench-loop"])
    m = measure(args.broker, args.steps, agents, args.profile)
    print(f"{args.broker}, {args.steps} steps, one prefork slot: ms per step")
    print(f"{'':16} {'wall':>6} {'child CPU':>9} {'main CPU':>8}")
    for name, (wall, c, p) in m.rows.items():
        print(f"{name:16} {wall:6.3f} {c:9.3f} {p:8.3f}")
    if m.stats is None:
        return
    print(
        f"\npool child, {agents[0]}, profiled: {m.profiled_ms:.3f} ms CPU/step "
        f"under cProfile; shares scaled to {m.rows[agents[0]][1]:.3f} ms (unprofiled)"
    )
    total = sum(m.layers.values())
    for name, ms in m.layers.most_common():
        print(f"  {ms / total:6.1%}  {ms:5.2f} ms  {name}")
    for layer in ("harness", "Celery, kombu, billiard", "SQLAlchemy", "psycopg", "redis-py"):
        print(f"\n{layer}: cumulative CPU, ms per step (profiled)")
        for seconds, name in hot(m.stats, layer):
            print(f"  {seconds * 1000 / m.steps:6.3f}  {name}")


if __name__ == "__main__":
    main()
