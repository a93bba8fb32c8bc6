"""Runs carried by real `celery -A tasks worker` processes on each broker."""

from __future__ import annotations

import pytest

from harness import api
from tests.cluster import Cluster

pytestmark = pytest.mark.slow


def test_runs_complete_with_one_effect_per_step(any_cluster: Cluster) -> None:
    any_cluster.worker()
    any_cluster.beat()
    run_ids = any_cluster.start("chain", count=3)
    # re-dispatching runs that are already moving must not start second chains
    rt = api.runtime()
    for run_id in run_ids:
        for cursor in (None, 0, 1):
            rt.dispatch(run_id, cursor)  # type: ignore[arg-type]
    any_cluster.assert_completed_once(run_ids)
    run = api.get_run(run_ids[0])
    assert run.result == "3 effects done" and run.cursor == 7


def test_message_for_a_missing_run_is_dropped(any_cluster: Cluster) -> None:
    worker = any_cluster.worker()
    api.runtime().dispatch("ghost-run", 0)
    any_cluster.wait_until(
        "the drop to be logged", lambda: "run=ghost-run does not exist" in worker.log()
    )
    run_ids = any_cluster.start("chain")
    any_cluster.assert_completed_once(run_ids)
