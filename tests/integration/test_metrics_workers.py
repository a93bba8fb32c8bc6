"""Metrics scraped during a run with prefork workers (PostgreSQL, Redis broker).

Real ``celery worker`` processes with two pool children write their
measurements into HARNESS_METRICS_DIR; this process scrapes
:func:`metrics.exposition` as the API would, while runs are in flight and
after. Counters only grow, end equal to what the flight recorder holds, and
recycled children leave no more files than there are pool slots.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import api
from harness.observability import metrics
from harness.records import RunStatus
from harness.settings import Settings
from tests.cluster import Cluster
from tests.unit.test_metrics import samples

pytestmark = pytest.mark.slow
RESULTS = ("done", "failed", "in_doubt")


def _scrape(settings: Settings) -> dict[str, float]:
    """Steps counted by the workers, and runs still moving per the store."""
    got = samples(metrics.exposition(api.reads(), settings)[0])
    steps = sum(v for (name, _), v in got.items() if name == "harness_steps_total")
    moving = sum(
        v
        for (name, labels), v in got.items()
        if name == "harness_runs" and dict(labels)["status"] in ("pending", "running")
    )
    return {"steps": steps, "moving": moving}


def _results_recorded(run_ids: list[str]) -> int:
    """Step results in the flight recorder: what the workers should have counted."""
    return sum(
        1
        for run_id in run_ids
        for event in api.reads().all_history(run_id)
        if event.step_index is not None and event.to_status in RESULTS
    )


def _scrape_until_done(
    c: Cluster, settings: Settings, run_ids: list[str]
) -> list[dict[str, float]]:
    scrapes = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        scrapes.append(_scrape(settings))
        runs = [api.get_run(r) for r in run_ids]
        if all(r.status.terminal for r in runs):
            break
        time.sleep(0.05)
    c.assert_completed_once(run_ids)
    scrapes.append(_scrape(settings))
    return scrapes


@pytest.mark.postgres
@pytest.mark.redis
def test_counters_grow_during_runs_and_match_the_steps_executed(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    directory = tmp_path / "metrics"
    c = make_cluster("redis", HARNESS_METRICS_DIR=str(directory))
    c.worker("--concurrency=2")
    c.beat()
    settings = Settings.from_env()
    started = time.monotonic()
    run_ids = c.start("long-chain", 4)
    scrapes = _scrape_until_done(c, settings, run_ids)
    print(f"{len(scrapes)} scrapes in {time.monotonic() - started:.1f}s: {scrapes[::10]}")
    counts = [s["steps"] for s in scrapes]
    assert counts == sorted(counts), "a counter went back"
    assert any(s["moving"] > 0 and s["steps"] > 0 for s in scrapes), "no scrape mid-run"
    assert counts[-1] == _results_recorded(run_ids) == 4 * 17
    final = samples(metrics.exposition(api.reads(), settings)[0])
    assert final[("harness_runs", (("status", "completed"),))] == 4
    tool_done = (("kind", "tool"), ("outcome", "done"))
    assert final[("harness_step_duration_seconds_count", tool_done)] == 4 * 8
    # One counter and one histogram file per pool slot; beat and the main process write none.
    slots = {p.name.split("_", 1)[1] for p in directory.glob("*.db")}
    assert {s.rsplit("-", 1)[1] for s in slots} == {"0.db", "1.db"}, slots
    assert len(list(directory.glob("*.db"))) == 4
    assert len(list(directory.glob("*.lock"))) == 2


@pytest.mark.postgres
@pytest.mark.redis
def test_recycled_children_reuse_their_slots_files(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    directory = tmp_path / "metrics"
    c = make_cluster("redis", HARNESS_METRICS_DIR=str(directory))
    worker = c.worker("--concurrency=2", "--max-tasks-per-child=1")
    c.beat()
    settings = Settings.from_env()
    first_children = set(worker.children())
    run_ids = c.start("long-chain", 2)
    scrapes = _scrape_until_done(c, settings, run_ids)
    counts = [s["steps"] for s in scrapes]
    assert counts == sorted(counts), "a counter went back when a child was replaced"
    assert counts[-1] == _results_recorded(run_ids)
    assert not first_children & set(worker.children()), "children were not recycled"
    files = sorted(p.name for p in directory.glob("*.db"))
    print(f"{counts[-1]} steps, files: {files}")
    assert len(files) <= 4, files  # counters and histograms of two slots
    assert all(api.get_run(r).status is RunStatus.COMPLETED for r in run_ids)
