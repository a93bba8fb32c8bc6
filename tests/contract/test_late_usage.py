"""A model call paid for is charged to its run, once, even when the run ended
while the call was under way (a cancel fences the step's result checkpoint
off), on both stores.

The runner executes in-process with a real provider SDK talking to the local
wire-format server (tests.wire); an operator's cancel is made at a chosen
moment of the call, and a crash point stands in for a SIGKILL.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import harness
from harness import observability
from harness.agents import register_agent
from harness.engine import billing, operations, transitions
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.providers.base import ProviderModel
from harness.providers.prices import Prices
from harness.records import RunStatus, StepStatus
from harness.runs import archive
from harness.store import BILLED, Checkpoint, StepPatch
from harness.store.sql import SQLStore
from tests.rig import Rig, insert_run
from tests.wire import WireServer

PRICES = Prices.parse('{"openai:gpt-test": {"input": 2, "output": 10}}')
PAID = {"input_tokens": 5000, "output_tokens": 4000}
COST = (5000 * 2 + 4000 * 10) / 1e6


@harness.tool(effect="idempotent")
def note(text: str) -> str:
    """Note something down."""
    return text


class Died(BaseException):
    """Stands in for a SIGKILL in-process."""


@pytest.fixture
def rig(store: SQLStore) -> Rig:
    rig = Rig(store)
    rig.options["prices"] = PRICES
    return rig


def paid_bot(wire: WireServer) -> ProviderModel:
    model = harness.OpenAIModel("gpt-test")
    register_agent(harness.Agent(name="paid", model=model, tools=[note]))
    wire.script(
        "paid",
        [{"tool_calls": [{"name": "note", "args": {"text": "x"}}], "usage": PAID}, {"text": "ok"}],
    )
    return model


def charged(rig: Rig, run_id: str) -> tuple[int, int, float, int]:
    """The run's tokens and cost, and how many times a late call was charged."""
    run = rig.load(run_id)
    billed = [e for e in rig.store.events(run_id) if e.to_status == BILLED]
    return run.input_tokens, run.output_tokens, round(run.cost_usd, 9), len(billed)


def test_a_call_that_returns_after_a_cancel_is_charged_to_the_cancelled_run(
    rig: Rig, wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = paid_bot(wire)
    run_id = create_run(rig.runtime(), "paid", "paid")
    send = model._send

    def cancel_meanwhile(*args: Any, **kwargs: Any) -> Any:
        operations.cancel(rig.runtime("operator"), run_id, "enough")
        return send(*args, **kwargs)

    monkeypatch.setattr(model, "_send", cancel_meanwhile)
    measured: list[tuple[str, int, int, float | None]] = []
    monkeypatch.setattr(
        observability.metrics,
        "model_usage",
        lambda name, usage, cost: measured.append(
            (name, usage.input_tokens, usage.output_tokens, cost)
        ),
    )
    assert rig.drive(limit=1) == [TaskResult.CANCELLED]
    assert measured == [("openai:gpt-test", 5000, 4000, COST)]  # the metrics count it too
    assert rig.load(run_id).status is RunStatus.CANCELLED
    assert charged(rig, run_id) == (5000, 4000, COST, 1)
    # The step says what the call cost; the run's usage still agrees with its steps.
    turn = rig.store.steps(run_id)[0].to_dict()
    assert turn["usage"] == PAID and turn["cost_usd"] == pytest.approx(COST)
    assert turn["status"] == StepStatus.RUNNING.value  # its result was never recorded
    assert wire.billed("paid", 0) == 1
    # A state an export carries to another store as it is.
    document = archive.export_run(rig.store, run_id)
    rig.store.reset()
    assert archive.import_run(rig.store, archive.dumps(document)).imported
    assert charged(rig, run_id) == (5000, 4000, COST, 1)


def test_a_response_recorded_before_its_worker_died_is_charged_by_the_cancel(
    rig: Rig, wire: WireServer
) -> None:
    def crash(point: str, kind: str) -> None:
        if point == "after_model_returned":
            raise Died

    paid_bot(wire)
    run_id = create_run(rig.runtime(), "paid", "paid")
    rig.options["crash"] = crash
    with pytest.raises(Died):
        rig.drive(limit=1)
    rig.options.pop("crash")
    assert charged(rig, run_id) == (0, 0, 0.0, 0)
    operations.cancel(rig.runtime("operator"), run_id, "enough")
    assert charged(rig, run_id) == (5000, 4000, COST, 1)
    # Once: the dead worker's own charge, had it lived, and a second cancel add nothing.
    step = rig.store.steps(run_id)[0]
    assert not billing.bill_after_end(rig.runtime(), run_id, step.index, step.result, None)
    operations.cancel(rig.runtime("operator"), run_id, "again")
    assert charged(rig, run_id) == (5000, 4000, COST, 1)


def test_a_run_that_goes_on_is_not_charged_beside_its_checkpoint(rig: Rig) -> None:
    """Only an ended run is charged this way: a run taken over is charged by
    the result checkpoint of whoever carries the step on."""
    run = insert_run(rig.store, "r1")
    result = {"final": "x", "usage": PAID, "cost_usd": COST}
    assert not rig.store.add_late_usage("r1", 0, result, 5000, 4000, COST, "w", 1.0, "late")
    assert rig.load("r1").input_tokens == 0
    rig.store.checkpoint(transitions.cancel(run, "stop", now=2.0))
    assert rig.store.add_late_usage("r1", 0, result, 5000, 4000, COST, "w", 3.0, "late")
    assert rig.load("r1").input_tokens == 5000


def test_writers_racing_to_charge_one_call_charge_it_once(rig: Rig) -> None:
    run = insert_run(rig.store, "r1")
    rig.store.checkpoint(transitions.cancel(run, "stop", now=2.0))
    result = {"final": "x", "usage": PAID, "cost_usd": COST}
    barrier = threading.Barrier(6)
    outcomes: list[bool] = []

    def charge(n: int) -> None:
        barrier.wait(timeout=10)
        outcomes.append(
            rig.store.add_late_usage("r1", 0, result, 5000, 4000, COST, f"w{n}", 3.0, "late")
        )

    threads = [threading.Thread(target=charge, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == [False] * 5 + [True]
    assert charged(rig, "r1") == (5000, 4000, COST, 1)


def _died_after_the_response(rig: Rig, wire: WireServer) -> str:
    """A paid run whose worker died after recording the model's response."""

    def crash(point: str, kind: str) -> None:
        if point == "after_model_returned":
            raise Died

    paid_bot(wire)
    run_id = create_run(rig.runtime(), "paid", "paid")
    rig.options["crash"] = crash
    with pytest.raises(Died):
        rig.drive(limit=1)
    rig.options.pop("crash")
    assert charged(rig, run_id) == (0, 0, 0.0, 0)
    return run_id


def test_a_cancel_whose_reply_was_lost_still_charges_the_recorded_call(
    rig: Rig, wire: WireServer
) -> None:
    """The cancel committed, its reply did not come back, and the operator (or
    the retry) cancels again: that repeat charges what the cancel owed."""
    run_id = _died_after_the_response(rig, wire)
    rig.store.checkpoint(transitions.cancel(rig.load(run_id), "enough", now=rig.clock.now()))
    again = operations.cancel(rig.runtime("operator"), run_id, "enough")
    assert again.changed is False
    assert charged(rig, run_id) == (5000, 4000, COST, 1)


def test_a_run_failed_by_its_limits_charges_the_call_its_dead_worker_paid_for(
    rig: Rig, wire: WireServer
) -> None:
    """The next worker finds the step over its attempts and fails the run: the
    response the dead one recorded is on the bill."""
    run_id = _died_after_the_response(rig, wire)
    run = rig.load(run_id)
    rig.store.checkpoint(  # as after max_attempts interruptions
        Checkpoint(
            run_id,
            run.version,
            "test",
            rig.clock.now(),
            steps=(StepPatch(0, attempts=99),),
        )
    )
    rig.clock.advance(10 * rig.lease_ttl)
    rig.sent.append((run_id, 0))
    assert rig.drive(limit=1) == [TaskResult.FAILED]
    assert rig.load(run_id).status is RunStatus.FAILED
    assert charged(rig, run_id) == (5000, 4000, COST, 1)
