"""Step cost of one checkout, for before-and-after comparisons of a change.

    git worktree add /tmp/before <commit>
    python bench/compare.py /tmp/before 5
    python bench/compare.py . 5

On Redis + PostgreSQL + the Redis cache: the median over ROUNDS of a bare
Celery hop, of the floor (``bench.floor_hop``: the hop plus a step's round
trips) and of a harness step through a real worker (1,000 each), of the
fast path's floor (``bench.fast_floor_hop``: the hop plus one SELECT and one
CAS UPDATE) and of a ``bench-loop-read`` step (every step on the fast path), and of
a step in-process (the runner in a loop, no broker: its wall time and the
CPU it took). The checkout's own ``harness`` and ``bench`` are imported,
and its workers run its code.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def main(root: str, rounds: int) -> str:
    sys.path.insert(0, root)
    # Workers run `python -m celery`, which puts their working directory first
    # on their path: theirs must be the checkout too, or they run another's code.
    os.chdir(root)
    import harness
    from bench.common import Setup
    from bench.steps import bare_hops, floor_hops, harness_steps
    from harness import api
    from harness.engine import creation, runner

    assert Path(harness.__file__).is_relative_to(Path(root).resolve()), harness.__file__
    with Setup("redis") as setup:
        setup.worker()
        bare_hops(setup, 200)  # warm-up: connections, prepared statements
        harness_steps("bench-loop", 201)
        floor_hops(setup, 200)
        fast_floor = "bench.fast_floor_hop"
        floor_hops(setup, 200, task=fast_floor)
        harness_steps("bench-loop-read", 201)
        hops, floors, steps, fast_floors, fast_steps = [], [], [], [], []
        for _ in range(rounds):  # interleaved: the machine's drift hits each alike
            hops.append(bare_hops(setup, 1000))
            floors.append(floor_hops(setup, 1000))
            steps.append(harness_steps("bench-loop", 1000).ms_per_step)
            fast_floors.append(floor_hops(setup, 1000, task=fast_floor))
            fast_steps.append(harness_steps("bench-loop-read", 1000).ms_per_step)
    with Setup("redis"):
        queue: list[tuple[str, int, Any]] = []
        rt = replace(
            api.runtime(),
            dispatch=lambda run_id, cursor, hint=None, **_: queue.append((run_id, cursor, hint)),
        )
        in_process, cpu = [], []
        for _ in range(rounds + 1):  # the first is a warm-up
            creation.create_run(rt, "bench-loop", "steps 1000")
            start, began, count = time.perf_counter(), time.process_time(), 0
            while queue:
                run_id, cursor, hint = queue.pop()  # a checkout from before hints has none
                runner.run_step(rt, run_id, cursor, **({"hint": hint} if hint else {}))
                count += 1
            in_process.append((time.perf_counter() - start) * 1000 / count)
            cpu.append((time.process_time() - began) * 1000 / count)
    hop, floor, step, fast_floor_ms, fast, alone, own = (
        statistics.median(x)
        for x in (hops, floors, steps, fast_floors, fast_steps, in_process[1:], cpu[1:])
    )
    return (
        f"{root}: hop {hop:.2f} ms, floor {floor:.2f} ms ({floor / hop:.2f}x), "
        f"step {step:.2f} ms ({step / hop:.2f}x the hop, {step / floor:.2f}x the floor), "
        f"fast-path floor {fast_floor_ms:.2f} ms, fast-path step {fast:.2f} ms "
        f"({fast / fast_floor_ms:.2f}x its floor), "
        f"in-process {alone:.3f} ms/step, of which CPU {own:.3f} ms"
    )


if __name__ == "__main__":
    print(main(str(Path(sys.argv[1]).resolve()), int(sys.argv[2]) if len(sys.argv) > 2 else 5))
