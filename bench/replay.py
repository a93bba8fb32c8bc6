"""``python -m bench.replay``: replay speed per step against live execution
(issue 12's closing figure).

On Redis + PostgreSQL + the Redis cache, one worker: a run of STEPS steps
(model turns alternating with tool calls) is executed live, then replayed
under the same agent, so that every tool call is served from the recording.
Printed side by side, as the median over ROUNDS: milliseconds per step live,
per step replayed, and their ratio; for a tool that does nothing (the
harness's own cost) and for one that waits 20 ms (a service call). A
measurement, not a test.

    python -m bench.replay [STEPS] [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys

from bench.common import Setup
from bench.steps import harness_steps
from harness import api
from harness.records import RunStatus


def replay_ms(recording: str, agent: str) -> float:
    """Wall milliseconds per step of a replay of ``recording`` under ``agent``."""
    replay_id = api.replay_run(recording, agent)
    (run,) = api.wait_all([replay_id], 600)
    if run.status is not RunStatus.COMPLETED:
        raise RuntimeError(f"replay {replay_id} ended {run.status}: {run.error}")
    report = api.replay_report(replay_id)
    assert report.outcome == "matched" and report.live == 0, report.to_dict()
    return (run.updated_at - run.created_at) * 1000 / run.step_count


def main(steps: int, rounds: int) -> None:
    with Setup("redis") as setup:
        setup.worker()
        harness_steps("bench-loop", 201)  # warm-up: connections, prepared statements
        print(f"{steps} steps per run, median of {rounds} rounds, one worker (Redis + PostgreSQL)")
        print(f"{'tool':<22} {'live ms/step':>13} {'replay ms/step':>15} {'replay/live':>12}")
        for agent, what in (("bench-loop", "does nothing"), ("bench-loop-api", "waits 20 ms")):
            live, replayed = [], []
            for _ in range(rounds):
                timed = harness_steps(agent, steps)
                live.append(timed.ms_per_step)
                replayed.append(replay_ms(timed.steps[0].run_id, agent))
            lm, rm = statistics.median(live), statistics.median(replayed)
            print(f"{what:<22} {lm:>13.2f} {rm:>15.2f} {rm / lm:>11.2f}x")


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
        int(sys.argv[2]) if len(sys.argv) > 2 else 3,
    )
