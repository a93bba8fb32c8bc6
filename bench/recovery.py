"""Recovery time after SIGKILL of a whole worker in the middle of a tool call.

    python -m bench.recovery --broker redis --kills 20 --ttl 2 --sweep 0.5
    python -m bench.recovery --broker filesystem --kills 5

Two workers and one beat run; each round starts a run whose tool takes
1.5 s, SIGKILLs the worker executing it, and measures from the kill until
another worker starts the same step again (the ledger shows a second start)
and until the run completes. A replacement worker starts meanwhile, so two
are up at every kill. Recovery is bounded by lease TTL + sweep interval.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.common import BROKERS, Setup, wait
from harness import api
from harness.celery.process import WorkerProcess


def _starts(ledger: Path) -> list[tuple[str, int, float]]:
    if not ledger.exists():
        return []
    rows = [line.split() for line in ledger.read_text().splitlines()]
    return [(key, int(pid), float(at)) for key, pid, at in rows]


def measure(broker: str, kills: int, ttl: float, sweep: float) -> list[tuple[float, float]]:
    """(kill -> step started again, kill -> run completed) for each kill, seconds."""
    with Setup(broker, HARNESS_LEASE_TTL=str(ttl), HARNESS_SWEEP_INTERVAL=str(sweep)) as setup:
        setup.beat()
        workers = setup.workers(2)
        ledger = Path(setup.env["BENCH_LEDGER"])
        results = []
        for n in range(kills):
            run_id = api.start_run("bench-slow-tool", f"round {n}")
            key = f"{run_id}:1"
            wait(lambda key=key: any(k == key for k, _, _ in _starts(ledger)), what="the call")
            pid = next(p for k, p, _ in _starts(ledger) if k == key)
            victim = next(w for w in workers if pid in (w.pid, *w.children()))
            victim.kill()
            killed = time.time()
            workers.remove(victim)
            replacement = WorkerProcess(f"r{n}", setup.env, setup.home)
            setup.processes.append(replacement)
            wait(
                lambda key=key: sum(k == key for k, _, _ in _starts(ledger)) == 2, what="a restart"
            )
            restarted = max(at for k, _, at in _starts(ledger) if k == key)
            run = api.wait_for(run_id, 60, poll=0.02)
            if run.status != "completed":
                raise RuntimeError(f"recovery round {n}: run ended {run.status}: {run.error}")
            results.append((restarted - killed, time.time() - killed))
            workers.append(replacement.wait_ready(60))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=sorted(BROKERS), default="filesystem")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--sweep", type=float, default=0.5)
    args = parser.parse_args()
    results = measure(args.broker, args.kills, args.ttl, args.sweep)
    for n, (again, done) in enumerate(results, 1):
        print(f"  kill {n}: step re-started after {again:.2f}s, run completed after {done:.2f}s")
    restart = [r for r, _ in results]
    print(
        f"{args.broker}: recovery (kill -> step re-started) over {len(restart)} kills: "
        f"median {statistics.median(restart):.2f}s, max {max(restart):.2f}s "
        f"(bound TTL + sweep = {args.ttl + args.sweep:.1f}s)"
    )


if __name__ == "__main__":
    main()
