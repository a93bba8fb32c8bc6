"""``python -m bench.many``: thousands of short runs at once (issue 13, item 4).

RUNS runs of ``bench-loop`` with STEPS steps each (model and no-op tool steps
alternating) are created first, their first messages held back, then all
released together onto WORKERS worker processes of one prefork slot each
(``celery -A tasks worker --concurrency 1``), on Redis + PostgreSQL. Measured:

* steps/s: every step of every run over the wall time, from the first
  message sent to the last step committed (creating the runs comes before
  and is reported apart);
* step latency, p50 and p99: for step i > 0 of a run, its ``finished_at``
  minus step i - 1's, the time from the moment its message could be sent
  (the previous step's result committed) to its own result committed, so it
  includes the wait in the queue behind the other runs' messages; for step 0,
  from the moment its message was sent;
* PostgreSQL transactions per step: ``xact_commit + xact_rollback`` of the
  benchmark database (``pg_stat_database``) across the execution (the runs'
  creation is counted before it), less the benchmark's own progress polls,
  over the steps; a load is a transaction too;
* the baseline, on the same workers: RUNS chains of STEPS bare hops
  (``bench.hop``), hops/s, and their mean latency by Little's law (chains
  over hops/s: no hop records when it ran); a hop opens no transaction.

With ``--profile SECONDS``, ``py-spy`` samples the first worker (its main
process and pool child, idle threads included) during the harness part, and
the samples are tallied by what they were doing (:mod:`bench.pyspy`). The
sampler takes CPU from the two cores the workers share, so the figures of a
profiled run are a little lower. A measurement, not a test.

    python -m bench.many [RUNS] [WORKERS] [STEPS] [--profile SECONDS]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import pyspy
from bench.common import Batch, Poller, Setup, finish_times, pg_transactions
from bench.steps import client, harness_steps
from harness import api

PY_SPY = Path(sys.executable).with_name("py-spy")


@dataclass(frozen=True)
class Many:
    runs: int
    workers: int
    steps: int  # per run, as asked
    create_s: float  # creating the runs, before the clock starts
    wall: float  # first message sent to last step committed
    total_steps: int  # every step executed
    p50_ms: float
    p99_ms: float
    mean_ms: float
    transactions: int  # PostgreSQL, while the runs executed
    hop_per_s: float
    hop_latency_ms: float  # Little's law: chains / hops per second
    profile: pyspy.Profile | None = None

    @property
    def steps_per_s(self) -> float:
        return self.total_steps / self.wall

    @property
    def transactions_per_step(self) -> float:
        return self.transactions / self.total_steps


def hop_chains(setup: Setup, hops: int, chains: int, timeout: float = 1800) -> float:
    """Wall milliseconds per hop over ``chains`` concurrent chains of ``hops``
    bare hops (bench.steps.bare_hops, polling at 4 Hz rather than checking
    thousands of files every few milliseconds on the workers' CPUs)."""
    sender = client()
    folder = setup.home / f"hops-{time.monotonic_ns()}"
    folder.mkdir()
    done = [folder / str(c) for c in range(chains)]
    start = time.time()
    for path in done:
        sender.send_task("bench.hop", (hops, str(path)))
    deadline = time.monotonic() + timeout
    remaining = set(done)
    while remaining:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(remaining)} hop chains unfinished after {timeout}s")
        time.sleep(0.25)
        remaining = {p for p in remaining if not (p.exists() and p.stat().st_size)}
    end = max(float(p.read_text()) for p in done)
    return (end - start) * 1000 / (hops * chains)


def latencies(finished: dict[str, list[float]], sent: dict[str, float]) -> list[float]:
    """Each step's latency in seconds, as the module docstring defines it."""
    out = []
    for run_id, times in finished.items():
        previous = sent[run_id]
        for t in times:
            out.append(t - previous)
            previous = t
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def measure(runs: int, workers: int, steps: int, profile_s: float = 0.0) -> Many:
    # No sweeps (Setup's default): four workers watching them every 5 s
    # (harness.celery.takeover) would leave the database no quiet 11 s to count in.
    with Setup("redis") as setup:
        procs = setup.workers(workers, ("--concurrency", "1"))
        hop_chains(setup, 50, chains=workers)  # warm-up: connections, prepared statements
        harness_steps("bench-loop", 21, runs=2 * workers)
        hop_ms = hop_chains(setup, steps, chains=runs)
        batch = Batch()
        began = time.perf_counter()
        ids = [batch.start("bench-loop", f"steps {steps}") for _ in range(runs)]
        create_s = time.perf_counter() - began
        # Counted once every session, the creating one included, has reported:
        # the count that follows is the execution's alone.
        api.reset_runtime()
        before = pg_transactions()
        poller = Poller()
        settled = poller.settled()
        spy = None
        sent = batch.release()
        if profile_s:
            spy = _spy(procs[0].pid, profile_s, setup.home / "profile.txt")
        poller.wait(settled + runs, 1800)
        if spy is not None:
            spy.wait()
        poller.close()
        setup.stop_workers()
        api.reset_runtime()
        transactions = pg_transactions() - before - poller.queries
        finished = finish_times(ids)
        lat = latencies(finished, sent)
        total = sum(len(t) for t in finished.values())
        wall = max(t[-1] for t in finished.values()) - min(sent.values())
        return Many(
            runs=runs,
            workers=workers,
            steps=steps,
            create_s=create_s,
            wall=wall,
            total_steps=total,
            p50_ms=percentile(lat, 50) * 1000,
            p99_ms=percentile(lat, 99) * 1000,
            mean_ms=statistics.fmean(lat) * 1000,
            transactions=transactions,
            hop_per_s=1000 / hop_ms,
            hop_latency_ms=runs * hop_ms,
            profile=pyspy.read(setup.home / "profile.txt") if profile_s else None,
        )


def _spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy on the worker ``pid`` and its pool child, idle threads included
    (a step waiting on PostgreSQL is idle to py-spy); not pausing them."""
    command = [str(PY_SPY), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200"]
    command += ["-f", "raw", "-o", str(out), "--subprocesses", "--idle", "--threads"]
    command += ["--nonblocking", "--full-filenames", "--nolineno"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def summary(m: Many) -> str:
    lines = [
        f"{m.runs} runs x {m.steps} steps started at once, {m.workers} workers "
        "(concurrency 1 each), Redis + PostgreSQL",
        f"  created in {m.create_s:.1f} s (before the clock), executed in {m.wall:.1f} s",
        f"  harness:   {m.steps_per_s:8.0f} steps/s over {m.total_steps} steps; "
        f"latency p50 {m.p50_ms:.0f} ms, p99 {m.p99_ms:.0f} ms, mean {m.mean_ms:.0f} ms",
        f"  bare hop:  {m.hop_per_s:8.0f} hops/s; mean latency {m.hop_latency_ms:.0f} ms "
        "(Little's law)",
        f"  ratio:     {m.hop_per_s / m.steps_per_s:.2f}x the hop's time per step",
        f"  PostgreSQL transactions per step: {m.transactions_per_step:.2f} "
        f"({m.transactions} in all, run creation not included; a hop: none)",
    ]
    if m.profile is not None:
        lines += ["", m.profile.table()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=int, default=5000)
    parser.add_argument("workers", nargs="?", type=int, default=4)
    parser.add_argument("steps", nargs="?", type=int, default=10)
    parser.add_argument(
        "--profile", type=float, default=0.0, metavar="SECONDS", help="py-spy the first worker"
    )
    args = parser.parse_args()
    print(summary(measure(args.runs, args.workers, args.steps, args.profile)), flush=True)


if __name__ == "__main__":
    main()
