"""Conversations carried by real `celery worker` processes, on the embedded
default and on PostgreSQL with Redis: a run continued three times carries
its whole conversation; a message sent while the model answers is answered
before the run completes (its final answer steered on)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import harness
from harness import api
from harness.records import RunStatus, StepKind
from tests.cluster import Cluster
from tests.conversation_agents import IMPORTS, answering

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MakeCluster = Callable[..., Cluster]


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_a_run_continued_three_times_carries_the_whole_conversation(
    make_cluster: MakeCluster, broker: str
) -> None:
    c = make_cluster(broker, HARNESS_IMPORTS=IMPORTS)
    c.worker()
    (run_id,) = c.start("listener")
    c.wait_ended([run_id])
    for text in ("one", "two", "three"):
        assert harness.send_message(run_id, text).outcome == "continued"
        (run,) = c.wait_ended([run_id])
        assert run.status is RunStatus.COMPLETED
    assert api.get_run(run_id).result == "turn 3 heard: one | two | three"
    kinds = [s.kind for s in api.get_steps(run_id)]
    assert kinds.count(StepKind.USER) == 3 and kinds.count(StepKind.MODEL) == 4


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_a_message_sent_during_a_turn_is_answered_before_the_run_completes(
    make_cluster: MakeCluster, broker: str
) -> None:
    c = make_cluster(broker, HARNESS_IMPORTS=IMPORTS)
    c.worker()
    run_id = api.start_run("listener", "answer slowly")
    c.wait_until("the model to be answering", answering(c.ledger_path).exists)
    assert harness.send_message(run_id, "and also this").outcome == "kept"
    (run,) = c.wait_ended([run_id])
    assert run.result == "turn 1 heard: and also this"
    completed = [e for e in api.runtime().store.events(run_id) if e.to_status == "completed"]
    assert len(completed) == 1  # it never completed without answering the message
