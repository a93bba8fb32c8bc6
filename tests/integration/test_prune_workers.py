"""``harness prune`` while real workers carry other runs: they still complete.

The embedded setup (SQLite, ``filesystem://``), where a prune and the workers'
checkpoints take turns at one write lock: a prune in short batches must let
every checkpoint through, and must never touch a run that is moving.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from harness import api
from harness.cli import main
from harness.records import RunStatus
from tests.cluster import Cluster
from tests.seeding import Seed, row_counts, seed

pytestmark = pytest.mark.slow

OLD_RUNS = 600


def test_prune_while_workers_carry_other_runs(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster("filesystem")
    c.worker("--concurrency=2")
    c.worker("--concurrency=2")
    c.beat()
    store = api.runtime().store
    now = time.time()
    statuses = ("completed", "failed", "cancelled")
    seed(
        store.engine,
        [Seed(f"old-{i:04}", statuses[i % 3], steps=10) for i in range(OLD_RUNS)],
        now,
    )
    live = c.start("slow-chain", count=4) + c.start("long-chain", count=4)
    c.wait_until(
        "every live run under way",
        lambda: all(api.get_run(r).cursor >= 1 for r in live),
        timeout=60,
    )

    result = CliRunner().invoke(
        main, ["prune", "--older-than", "1d", "--batch-size", "25", "--json"]
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    moving = [r for r in live if not api.get_run(r).status.terminal]
    print(
        f"\npruned {report['runs']} runs ({report['steps']} steps, {report['events']} events, "
        f"{report['tool_records']} tool records) in {report['batches']} batches, "
        f"{report['seconds']:.2f}s, while {len(moving)} of {len(live)} live runs still moved"
    )
    assert report["runs"] == OLD_RUNS
    assert report["runs_by_status"] == dict.fromkeys(sorted(statuses), OLD_RUNS // 3)
    assert report["steps"] == OLD_RUNS * 10
    assert report["tool_records"] == OLD_RUNS * 5
    c.assert_completed_once(live)
    leftover = row_counts(store.engine)
    assert leftover["runs"] == len(live)
    assert leftover["steps"] == sum(len(api.get_steps(r)) for r in live)

    # The live runs, finished now, are not old: a second prune keeps them.
    again = CliRunner().invoke(main, ["prune", "--older-than", "1d", "--json"])
    assert json.loads(again.stdout)["runs"] == 0
    assert {api.get_run(r).status for r in live} == {RunStatus.COMPLETED}
