"""Recovery without beat: real ``celery worker`` processes take the sweep over
(harness.celery.takeover), one at a time, and hand it back when beat sweeps.

Sweep interval 0.5 s and lease TTL 2 s (tests.cluster): a worker up for three
intervals with no beat sweep takes the sweep lease."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from harness import api
from harness.celery.process import WorkerProcess
from harness.store import Sweep, SweepKind
from tests.cluster import Cluster

pytestmark = pytest.mark.slow

TAKES_OVER = "(is `celery beat` running?): this worker sweeps until one is"


def _node(proc: WorkerProcess) -> str:
    return f"{proc.name}@"


def _worker_sweeps() -> list[Sweep]:
    return [s for s in api.runtime().store.sweeps(1000) if s.kind is SweepKind.WORKER]


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_a_run_whose_worker_was_killed_completes_with_no_beat(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    c = make_cluster(broker)
    workers = [c.worker("--concurrency=1"), c.worker("--concurrency=1")]
    (run_id,) = c.start("slow-chain")
    c.wait_until("a tool call under way", lambda: c.ledger().unfinished(c.killed))
    ((key, pid),) = c.ledger().unfinished(c.killed).items()
    victim = next(w for w in workers if pid in (w.pid, *w.children()))
    survivor = next(w for w in workers if w is not victim)
    c.kill(victim)
    ledger = c.assert_completed_once([run_id])
    assert ledger.calls(key) == 2
    events = [e.to_status for e in api.runtime().store.events(run_id)]
    assert "redispatched" in events, events  # the broker never gave the message back
    assert TAKES_OVER in survivor.log()
    rescuers = [s for s in _worker_sweeps() if s.redispatched]
    assert rescuers and all(s.worker.startswith(_node(survivor)) for s in rescuers), rescuers


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_two_workers_with_no_beat_never_sweep_at_once(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    c = make_cluster(broker)
    workers = [c.worker(), c.worker()]
    c.wait_until("ten sweeps by a worker", lambda: len(_worker_sweeps()) >= 10)
    sweeps = sorted(_worker_sweeps(), key=lambda s: s.started_at)
    names = {_node(w) for w in workers}
    assert {s.worker.split("@")[0] + "@" for s in sweeps} <= names, sweeps
    for before, after in itertools.pairwise(sweeps):
        assert after.started_at >= before.finished_at, (before, after)
    assert sum(TAKES_OVER in w.log() for w in workers) >= 1


def test_a_worker_sweeps_only_while_beat_does_not(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster("filesystem")
    beat = c.beat()
    worker = c.worker()
    store = api.runtime().store
    c.wait_until("beat's sweeps", lambda: len(store.sweeps()) >= 8)
    assert _worker_sweeps() == [] and TAKES_OVER not in worker.log()
    # The worker took beat's probes (tasks.probe) off both lanes.
    c.wait_until("probes through", lambda: all(x.delivered_before for x in store.lanes().values()))
    assert len(store.lanes()) == 2 and "unregistered" not in worker.log()

    c.kill(beat)
    c.wait_until("the worker to take the sweep over", lambda: _worker_sweeps() != [])
    assert TAKES_OVER in worker.log()

    c.beat()
    c.wait_until("the worker to stand down", lambda: "this worker stops sweeping" in worker.log())
    handed_back = len(_worker_sweeps())
    c.wait_until("more of beat's sweeps", lambda: store.sweeps(4)[-1].kind is SweepKind.BEAT)
    assert len(_worker_sweeps()) == handed_back
