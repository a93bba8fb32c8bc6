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


@pytest.mark.parametrize("broker", ["redis"])
def test_turns_taken_by_any_worker_and_one_killed_mid_turn_hear_everything(
    make_cluster: MakeCluster, broker: str
) -> None:
    """Two workers carry a conversation's turns, whichever takes each, so a
    worker's memory of it (harness.engine.transcripts) meets steps the other
    appended; then every worker is SIGKILLed while the model answers, a new
    one takes the turn over, and the workers come back for more turns. Every
    turn hears the whole conversation, in order."""
    c = make_cluster(broker, HARNESS_IMPORTS=IMPORTS, HARNESS_LEASE_TTL="2")
    workers = [c.worker(), c.worker()]
    c.beat()
    (run_id,) = c.start("listener")
    c.wait_ended([run_id])
    said: list[str] = []

    def turn(text: str) -> None:
        said.append(text)
        assert harness.send_message(run_id, text).outcome == "continued"
        (run,) = c.wait_ended([run_id])
        assert run.status is RunStatus.COMPLETED, c.logs()
        assert run.result == f"turn {len(said)} heard: {' | '.join(said)}"

    for n in range(6):
        turn(f"message {n}")
    said.append("answer slowly")
    assert harness.send_message(run_id, "answer slowly").outcome == "continued"
    c.wait_until("the model to be answering", answering(c.ledger_path).exists)
    for worker in workers:
        c.kill(worker)
    c.worker()  # new to the run: it reads the conversation whole
    (run,) = c.wait_ended([run_id])
    assert run.result == f"turn {len(said)} heard: {' | '.join(said)}", c.logs()
    c.worker()
    for n in range(6, 10):
        turn(f"message {n}")
