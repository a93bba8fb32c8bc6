"""Peers side by side on one 3-tool agent loop (issue 26, goal 6).

    python -m bench.agentloop --runs 1000 --sequential 20 [--prefect-runs 200]

Every peer runs bench.toolloop's loop, 7 model steps and 6 tool steps a
run, on this machine's PostgreSQL (each on a database of its own, named
after bench.common's), and two figures are taken of each:

* ms per step: ``--sequential`` runs one after another, nothing else
  running; the median run's wall time / 13;
* seconds per 1,000 runs: ``--runs`` runs at once (``--prefect-runs`` for
  Prefect, whose runs take far longer), with the concurrency 2 cores
  allow each, scaled to 1,000 when fewer ran.

The peers:

* the harness: agent ``bench-tools3`` (bench.agents), end to end through
  Celery on Redis: 2 ``celery worker`` processes of one slot each, every
  step a broker hop and its checkpoints; the 1,000 runs created first with
  their first messages held, then released together (bench.common.Batch);
* plain Celery: ``bench.loop_model`` / ``bench.loop_tool``, the same loop as
  tasks each sending the next, the run's state only in the messages (no
  durability), on the same 2 workers and Redis: the floor under the harness;
* DBOS Transact and LangGraph (``PostgresSaver``, ``durability="sync"``),
  in-process (bench.peerloops): no broker; 2 processes for the 1,000 runs;
* Prefect 3 with persisted results, its flows in-process talking to a
  ``prefect server`` on loopback (bench.prefect_loop), in its own
  virtualenv ``.venv-prefect`` (``make bench-prefect-venv``): skipped when
  that is absent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import uuid
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import redis
from sqlalchemy import func, select

from bench import peerloops, toolloop
from bench.agents import LOOP_DONE
from bench.common import PG_URL, REPO, Batch, Poller, Setup, wait
from bench.peers import _fresh_database
from bench.results import Row
from bench.steps import client
from harness import api
from harness.engine import creation, runner
from harness.records import RunStatus
from harness.store import schema

AGENT = "bench-tools3"
WORKERS = 2
CELERY = "end to end"
INLINE_HOW = "the runner in a loop in this process, dispatch to a list: no broker, no worker"
PREFECT_PYTHON = REPO / ".venv-prefect" / "bin" / "python"


@dataclass(frozen=True)
class Figures:
    peer: str
    ms_per_step: float
    runs: int  # how many ran at once for ``wall_s``
    wall_s: float | None  # None: not measured at scale
    how: str  # the concurrency, and where the steps run
    kind: str  # "end to end" (through Celery) or "in-process": a short label

    @property
    def s_per_1000(self) -> float | None:
        return None if self.wall_s is None else self.wall_s * 1000 / self.runs


def _installed(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def harness_loop(sequential: int, runs: int) -> tuple[Figures, Figures, Figures]:
    """The harness agent and the plain Celery chain, on the same 2 workers."""
    with Setup("redis") as setup:
        setup.workers(WORKERS, ("--concurrency", "1"))
        cache = redis.Redis.from_url(setup.env["HARNESS_REDIS_URL"])
        chains(cache, 5)  # warm-up: connections, prepared statements
        for _ in range(5):
            _one_harness_run()
        ours = statistics.median(_one_harness_run() for _ in range(sequential))
        inline = _harness_in_process(sequential)
        ours_wall = _harness_batch(runs)
        chain = statistics.median(chains(cache, 1)[0] for _ in range(sequential))
        chain_wall = _chain_batch(cache, runs)
    how = f"{WORKERS} celery workers x 1 slot, Redis broker, end to end"
    return (
        Figures("harness", ours, runs, ours_wall, f"{how}, PostgreSQL + Redis cache", CELERY),
        Figures("plain Celery", chain, runs, chain_wall, f"{how}, no durability", CELERY),
        Figures("harness", inline, 0, None, INLINE_HOW, "in-process"),
    )


def _one_harness_run() -> float:
    """One run alone: ms per step from its creation to its last write."""
    run = api.wait_for(api.start_run(AGENT, "loop"), 60, poll=0.02)
    if run.status is not RunStatus.COMPLETED or run.step_count != toolloop.STEPS_PER_RUN:
        raise RuntimeError(f"run {run.run_id} ended {run.status} at {run.step_count}: {run.error}")
    return (run.updated_at - run.created_at) * 1000 / toolloop.STEPS_PER_RUN


def _harness_in_process(sequential: int) -> float:
    """The same runs without a broker (as bench.suite.in_process): the median
    run's ms per step, to set beside the in-process peers."""
    queue: list[tuple[str, int, Any]] = []

    def dispatch(run_id: str, cursor: int, hint: Any = None, **_: object) -> None:
        queue.append((run_id, cursor, hint))

    rt = replace(api.runtime(), dispatch=dispatch)

    def once() -> float:
        run_id = creation.create_run(rt, AGENT, "loop")
        start = time.perf_counter()
        while queue:
            runner.run_step(rt, *queue.pop())
        elapsed = time.perf_counter() - start
        run = rt.store.load(run_id)
        if run.status is not RunStatus.COMPLETED or run.step_count != toolloop.STEPS_PER_RUN:
            raise RuntimeError(f"in-process run {run_id} ended {run.status}: {run.error}")
        return elapsed * 1000 / toolloop.STEPS_PER_RUN

    for _ in range(5):
        once()
    return statistics.median(once() for _ in range(sequential))


def _harness_batch(runs: int) -> float:
    """``runs`` runs released at once: seconds until the last one's last write."""
    batch = Batch()
    ids = [batch.start(AGENT, "loop") for _ in range(runs)]
    poller = Poller(PG_URL)
    before = poller.settled()
    try:
        sent = batch.release()
        poller.wait(before + runs, timeout=3600)
    finally:
        poller.close()
    start = min(sent.values())
    engine = api.runtime().store.engine  # type: ignore[attr-defined]
    runs_t = schema.runs
    with engine.connect() as conn:
        query = select(func.count(), func.max(runs_t.c.updated_at)).where(
            runs_t.c.run_id.in_(ids), runs_t.c.status == RunStatus.COMPLETED.value
        )
        done, end = conn.execute(query).one()
    if done != runs:
        raise RuntimeError(f"{runs - done} of {runs} harness runs did not complete")
    return float(end) - start


def chains(cache: redis.Redis, runs: int) -> list[float]:
    """``runs`` plain Celery loops sent at once; each one's ms per step."""
    cache.delete(LOOP_DONE)
    sender = client()
    for _ in range(runs):
        sender.send_task("bench.loop_model", (uuid.uuid4().hex, time.time(), 0, []))
    wait(lambda: cache.llen(LOOP_DONE) >= runs, timeout=3600, what="the plain Celery loops")
    done = [line.split() for line in cache.lrange(LOOP_DONE, 0, -1)]
    return [(float(end) - float(sent)) * 1000 / toolloop.STEPS_PER_RUN for _, sent, end in done]


def _chain_batch(cache: redis.Redis, runs: int) -> float:
    """``runs`` plain Celery loops at once: seconds from the first send to the last answer."""
    chains(cache, runs)
    done = [line.split() for line in cache.lrange(LOOP_DONE, 0, -1)]
    return max(float(end) for *_, end in done) - min(float(sent) for _, sent, _ in done)


def in_process(peer: str, sequential: int, runs: int) -> Figures | None:
    """DBOS or LangGraph (bench.peerloops); None when not installed."""
    dist = {"dbos": "dbos", "langgraph": "langgraph"}[peer]
    release = _installed(dist)
    if release is None or not peerloops.importable(peer):
        return None
    _, name = PG_URL.rsplit("/", 1)
    url = _fresh_database(f"{name}_loop_{peer}")
    m = peerloops.measure(peer, url, sequential, runs)
    label = {"dbos": f"DBOS Transact {release}", "langgraph": f"LangGraph {release}"}[peer]
    how = f"in-process, {m.procs} processes, PostgreSQL"
    if peer == "langgraph":
        how += ', PostgresSaver durability="sync"'
    return Figures(label, m.ms_per_step, m.runs, m.wall_s, how, "in-process")


def prefect(sequential: int, runs: int) -> Figures | None:
    """Prefect in its own virtualenv (bench.prefect_loop); None without it."""
    if not PREFECT_PYTHON.exists():
        return None
    _, name = PG_URL.rsplit("/", 1)
    db = _fresh_database(f"{name}_loop_prefect").replace("postgresql://", "postgresql+asyncpg://")
    command = [str(PREFECT_PYTHON), "-m", "bench.prefect_loop", "--db", db]
    command += ["--sequential", str(sequential), "--runs", str(runs)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"bench.prefect_loop failed:\n{done.stderr[-3000:]}")
    m = json.loads(done.stdout.strip().splitlines()[-1])
    how = (
        f"flows in-process, {m['procs']} processes, + a prefect server; PostgreSQL, results on disk"
    )
    label = f"Prefect {m['version']}"
    return Figures(label, m["ms_per_step"], m["runs"], m["wall_s"], how, "in-process + server")


def measure(sequential: int, runs: int, prefect_runs: int) -> list[Figures]:
    """Every peer's figures, printing each as it comes; a missing peer is said and skipped."""
    figures = list(harness_loop(sequential, runs))
    for peer in ("dbos", "langgraph"):
        found = in_process(peer, sequential, runs)
        if found is None:
            print(f"  {peer}: not installed (pip install -e '.[bench]')", flush=True)
        else:
            figures.append(found)
    found = prefect(sequential, prefect_runs)
    if found is None:
        print("  prefect: no .venv-prefect (make bench-prefect-venv)", flush=True)
    else:
        figures.append(found)
    return figures


def rows(figures: list[Figures]) -> list[Row]:
    """The suite's rows: each peer's two figures, with the harness's as baselines."""
    ours = next(f for f in figures if f.peer == "harness" and f.kind == CELERY)
    inline = next(f for f in figures if f.peer == "harness" and f.kind == "in-process")
    made = []
    for f in figures:
        what = f"3-tool loop, {f.peer}, {f.kind}"
        # An in-process peer's step against the harness's in-process one, too.
        base = ours if f.kind == CELERY or f is inline else inline
        note = "(7 model + 6 tool steps a run; ratio: against the harness, " + (
            "end to end)" if base is ours else "in-process)"
        )
        made.append(
            Row(
                f"{what}, runs one at a time",
                f.ms_per_step,
                "ms/step",
                None if f is ours else base.ms_per_step,
                note=note,
            )
        )
        if f.s_per_1000 is not None:
            made.append(
                Row(
                    f"{what}, {f.runs} runs at once",
                    f.s_per_1000,
                    "s/1,000 runs",
                    None if f is ours else ours.s_per_1000,
                    note="(scaled to 1,000 runs; ratio: against the harness end to end)",
                )
            )
    return made


def table(figures: list[Figures]) -> str:
    lines = [f"{'peer':<22} {'ms/step':>8} {'s/1,000 runs':>13} {'(runs at once)':>15}  how"]
    for f in figures:
        per_1000 = "-" if f.s_per_1000 is None else f"{f.s_per_1000:.1f}"
        lines.append(f"{f.peer:<22} {f.ms_per_step:>8.2f} {per_1000:>13} {f.runs:>15}  {f.how}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=20, help="runs timed one at a time")
    parser.add_argument("--runs", type=int, default=1000, help="runs at once")
    parser.add_argument("--prefect-runs", type=int, default=200, help="Prefect's runs at once")
    args = parser.parse_args()
    print(table(measure(args.sequential, args.runs, args.prefect_runs)))


if __name__ == "__main__":
    main()
