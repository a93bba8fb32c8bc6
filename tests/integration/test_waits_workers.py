"""Runs that wait on the world, carried by real `celery worker` processes on
each broker: deferred runs hold no slot; a callback acts once, across a
SIGKILL of the worker and with no worker running; a forged token changes
nothing; a signal sent before its wait is taken once; a timeout is the
model's to handle; a sleep survives a SIGKILL; a child run is started once
across SIGKILLs of its parent's worker and its own, has its effect once, is
held to what its parent has left, and is cancelled with its parent.

The agents are in tests/wait_agents.py; calls are counted in the external
ledger. Answers come from this process, on the same store and broker, the
way `harness complete`, `harness signal` and the callback route send them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import harness
from harness import api, callbacks
from harness.engine import recovery, waits
from harness.errors import DecisionConflict
from harness.records import Run, RunStatus, Step, StepStatus, WaitKind
from tests.cluster import Cluster
from tests.ledger import Ledger
from tests.wait_agents import ENV, SECRET, callback_urls

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BROKERS = ["filesystem", "redis", "rabbitmq"]
#: A worker that SIGKILLs itself at a crash point, whole: with the solo pool the
#: crash takes the worker down, not one pool child that a fresh one replaces.
ONE_PROCESS = {"HARNESS_WORKER_POOL": "solo"}

MakeCluster = Callable[..., Cluster]


def waits_cluster(make_cluster: MakeCluster, broker: str, **overrides: str) -> Cluster:
    """A cluster whose workers carry tests/wait_agents.py and sign callbacks."""
    return make_cluster(broker, **ENV, **overrides)


def step(run_id: str, index: int) -> Step:
    return api.get_steps(run_id)[index]


def has_waited(run_id: str, index: int) -> bool:
    """Step ``index`` deferred, whether or not it has had its answer since."""
    steps = api.get_steps(run_id)
    return len(steps) > index and steps[index].wait is not None


def deferred(run_id: str, index: int = 1) -> Callable[[], bool]:
    """The run waits, with its step ``index`` deferred."""

    def check() -> bool:
        run = api.get_run(run_id)
        return run.status is RunStatus.WAITING and step(run_id, index).status is StepStatus.DEFERRED

    return check


def token_of(c: Cluster, key: str) -> str:
    """The token of the callback URL the courier was given for call ``key``."""
    urls = [url for k, url in callback_urls(c.ledger_path) if k == key]
    assert urls, f"no callback URL for {key}"
    return urls[0].rsplit("/", 1)[1]


def crash_worker(c: Cluster, point: str) -> None:
    """Start a worker armed at ``point`` and note it killed once it has died there."""
    doomed = c.worker(env={"HARNESS_CRASH_AT": point, **ONE_PROCESS})
    c.wait_until(f"the worker to die at {point}", lambda: doomed.proc.poll() is not None)
    assert f"crash point {point.split('.')[0]} armed" in doomed.log()
    c.kill(doomed)


def finished(c: Cluster, run_ids: list[str]) -> Ledger:
    """Wait for the runs to end, through their waits, then check them against
    the ledger (Cluster.assert_completed_once): each completed, each call once."""
    c.wait_ended(run_ids)
    return c.assert_completed_once(run_ids)


def sweep_until(c: Cluster, what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    """Sweep from this process, as `harness sweep` does, until ``check`` holds:
    no beat runs, so nothing else wakes a run whose time has come."""
    rt = api.runtime()
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}\n{c.logs()}")
        recovery.sweep(rt)
        time.sleep(0.2)


# -- 1. a deferred run holds no slot -----------------------------------------


@pytest.mark.parametrize("broker", BROKERS)
def test_deferred_runs_hold_no_slot(make_cluster: MakeCluster, broker: str) -> None:
    """Five runs deferred on a worker of one slot: an ordinary run still goes
    through; answered, the five finish, each call made once."""
    c = waits_cluster(make_cluster, broker)
    c.worker("--concurrency=1")
    waiting = c.start("w-courier", count=5)
    for run_id in waiting:
        c.wait_until(f"{run_id} to defer", deferred(run_id))
    (ordinary,) = c.start("chain")
    (run,) = c.wait_all([ordinary])
    assert run.status is RunStatus.COMPLETED, c.logs()
    for run_id in waiting:
        run = api.get_run(run_id)
        assert (run.status, run.owner) == (RunStatus.WAITING, None)
        wait = step(run_id, 1).wait
        assert wait is not None and wait.kind is WaitKind.CALLBACK and wait.until is not None

    for i, run_id in enumerate(waiting):
        done = harness.complete_step(run_id, result={"delivered": i}, by="courier")
        assert (done.delivery, done.step) == (waits.Delivery.ANSWERED, 1)
    ledger = finished(c, [*waiting, ordinary])
    for i, run_id in enumerate(waiting):
        assert step(run_id, 1).result == {"delivered": i}
        assert ledger.calls(f"{run_id}:1") == 1


# -- 2. and 3. callbacks -----------------------------------------------------


@pytest.mark.parametrize("broker", BROKERS)
@pytest.mark.parametrize("kill", ["while-waiting", "after_result_checkpoint.tool"])
def test_a_callback_acts_once_across_a_sigkill_with_no_worker_running(
    make_cluster: MakeCluster, broker: str, kill: str
) -> None:
    """The worker dies with the run waiting (or right after recording the
    deferral, its model turn never sent); the courier calls back twice while
    no worker runs; a new worker finishes the run with the first answer, and
    the courier was asked once."""
    c = waits_cluster(make_cluster, broker)
    (run_id,) = c.start("w-courier")
    if kill == "while-waiting":
        first = c.worker()
        c.wait_until("the call to defer", deferred(run_id))
        c.kill(first)
    else:
        crash_worker(c, kill)
        run = api.get_run(run_id)
        assert (run.status, run.cursor) == (RunStatus.RUNNING, 2)  # its turn's message lost
        assert step(run_id, 1).status is StepStatus.DEFERRED

    rt = api.runtime()
    token = token_of(c, f"{run_id}:1")
    answered = waits.callback(rt, token, {"tracking": "T1"}, None)
    assert (answered.delivery, answered.step) == (waits.Delivery.ANSWERED, 1)
    again = waits.callback(rt, token, {"tracking": "T2"}, None)
    assert again.delivery is waits.Delivery.ALREADY and not again.changed
    assert step(run_id, 1).result == {"tracking": "T1"}

    c.worker()
    c.beat()  # to re-send the message the crash lost
    ledger = finished(c, [run_id])
    assert ledger.calls(f"{run_id}:1") == 1
    assert step(run_id, 1).result == {"tracking": "T1"}
    assert api.get_run(run_id).result == "shipped"
    answers = [e for e in rt.store.events(run_id) if e.step_index == 1 and e.to_status == "done"]
    assert [e.detail for e in answers] == ["callback"]


@pytest.mark.parametrize("broker", BROKERS)
def test_a_forged_token_is_refused_and_changes_nothing(
    make_cluster: MakeCluster, broker: str
) -> None:
    c = waits_cluster(make_cluster, broker)
    c.worker()
    (run_id,) = c.start("w-courier")
    c.wait_until("the call to defer", deferred(run_id))
    rt = api.runtime()
    token = token_of(c, f"{run_id}:1")
    payload, signature = token.split(".")
    before = api.get_run(run_id)
    events = len(rt.store.events(run_id))
    claim = callbacks.CallbackClaim(run_id, 1, 1, time.time() + 3600)
    forgeries = [
        f"{payload}.{signature[:-4]}AAAA",  # an altered signature
        callbacks.sign("not-" + SECRET, claim),  # another secret's
        # the payload of another step, under this step's signature
        f"{callbacks.sign(SECRET, callbacks.CallbackClaim(run_id, 0, 1, 0.0)).split('.')[0]}"
        f".{signature}",
        "not-a-token",
    ]
    for forged in forgeries:
        with pytest.raises(callbacks.BadToken):
            waits.callback(rt, forged, {"tracking": "forged"}, None)
    after = api.get_run(run_id)
    assert (after.status, after.version) == (RunStatus.WAITING, before.version)
    assert step(run_id, 1).status is StepStatus.DEFERRED
    assert len(rt.store.events(run_id)) == events
    assert rt.store.kept_signals(run_id) == []

    assert waits.callback(rt, token, {"tracking": "real"}, None).changed
    finished(c, [run_id])
    assert step(run_id, 1).result == {"tracking": "real"}


# -- 4. a signal before its wait ---------------------------------------------


@pytest.mark.parametrize("broker", BROKERS)
@pytest.mark.parametrize("when", ["before-any-worker", "right-after-start"])
def test_a_signal_sent_before_its_wait_is_taken_once(
    make_cluster: MakeCluster, broker: str, when: str
) -> None:
    """Sent before the step that waits for it has run (no worker yet: it is
    surely kept; or racing a live worker), then again with the same id: the
    step takes it once and the run completes with its data."""
    c = waits_cluster(make_cluster, broker)
    if when == "right-after-start":
        c.worker()
    (run_id,) = c.start("w-payer")
    sent = harness.signal(run_id, "paid", {"amount": 5}, signal_id="tx-1")
    if when == "before-any-worker":
        assert (sent.delivery, sent.step) == (waits.Delivery.KEPT, None)
    else:
        assert sent.delivery in (waits.Delivery.KEPT, waits.Delivery.ANSWERED)
    again = harness.signal(run_id, "paid", {"amount": 500}, signal_id="tx-1")
    assert again.delivery is waits.Delivery.ALREADY and not again.changed
    if when == "before-any-worker":
        c.worker()
    ledger = finished(c, [run_id])
    assert ledger.calls(f"{run_id}:1") == 1
    assert step(run_id, 1).result == {"amount": 5}
    assert api.get_run(run_id).result == "paid"
    assert api.runtime().store.kept_signals(run_id) == []
    with pytest.raises(DecisionConflict):  # the run has ended: no step will take another
        harness.signal(run_id, "paid", {"amount": 5}, signal_id="tx-2")


# -- 5. a timeout ------------------------------------------------------------


@pytest.mark.parametrize("broker", BROKERS)
def test_a_timeout_is_the_models_to_handle(make_cluster: MakeCluster, broker: str) -> None:
    """Nobody calls back within 1.5 s: the sweeper (beat) times the step out,
    and the model's next turn reads the error and answers."""
    c = waits_cluster(make_cluster, broker)
    c.worker()
    c.beat()
    (run_id,) = c.start("w-patient")
    (run,) = c.wait_ended([run_id])
    assert run.status is RunStatus.COMPLETED, c.logs()
    called = step(run_id, 1)
    assert called.status is StepStatus.FAILED
    assert called.error is not None and called.error.startswith("no answer within 1.5 s")
    assert run.result == f"the courier never came back: {called.error}"
    assert c.ledger().calls(f"{run_id}:1") == 1
    late = harness.complete_step(run_id, 1, result={"tracking": "late"})
    assert late.delivery is waits.Delivery.ALREADY  # the timeout won; nothing changes
    assert step(run_id, 1).error == called.error


@pytest.mark.parametrize("broker", BROKERS)
def test_a_callback_racing_the_timeout_has_one_winner(
    make_cluster: MakeCluster, broker: str
) -> None:
    """Callbacks sent from just before a step's timeout to just after the
    sweep that would time it out: whichever lands first is the step's one
    answer, the history names it, and the model is told that one."""
    c = waits_cluster(make_cluster, broker)
    c.worker()
    c.beat()
    run_ids = c.start("w-patient", count=4)
    rt = api.runtime()
    sent = {}
    for i, run_id in enumerate(run_ids):
        # Its wait, kept on the step once answered: a loaded machine may see
        # the step only after its 1.5 s have run out and the sweeper answered it.
        c.wait_until("the call to defer", lambda run_id=run_id: has_waited(run_id, 1))
        wait = step(run_id, 1).wait
        assert wait is not None and wait.until is not None
        at = wait.until - 0.1 + i * 0.2  # the sweeper looks every 0.5 s
        c.wait_until("the moment to call back", lambda at=at: time.time() >= at)
        token = token_of(c, f"{run_id}:1")
        sent[run_id] = waits.callback(rt, token, {"tracking": "just in time"}, None)
    for run in c.wait_ended(run_ids):
        answered = step(run.run_id, 1)
        answers = [
            e
            for e in rt.store.events(run.run_id)
            if e.step_index == 1 and e.from_status == StepStatus.DEFERRED
        ]
        assert len(answers) == 1, answers
        assert run.status is RunStatus.COMPLETED
        if sent[run.run_id].delivery is waits.Delivery.ANSWERED:
            assert answered.status is StepStatus.DONE and answers[0].detail == "callback"
            assert run.result == "the courier came back: {'tracking': 'just in time'}"
        else:
            assert sent[run.run_id].delivery is waits.Delivery.ALREADY
            assert answered.status is StepStatus.FAILED
            assert (answers[0].detail or "").startswith("timed out: no answer within 1.5 s")
            assert run.result == f"the courier never came back: {answered.error}"
    print({r: sent[r].delivery.value for r in run_ids})


# -- 6. a sleep --------------------------------------------------------------


@pytest.mark.parametrize("broker", BROKERS)
@pytest.mark.parametrize("kill", ["while-sleeping", "after_result_checkpoint.tool"])
def test_a_sleep_survives_a_sigkill(make_cluster: MakeCluster, broker: str, kill: str) -> None:
    """A Sleep(2) step: the worker is SIGKILLed while the run sleeps (or right
    after recording the sleep); a new worker and the sweeps wake it no sooner
    than asked, and the nap was taken once."""
    c = waits_cluster(make_cluster, broker)
    (run_id,) = c.start("w-napper")
    if kill == "while-sleeping":
        first = c.worker()
        c.wait_until("the nap to begin", deferred(run_id))
        c.kill(first)
    else:
        crash_worker(c, kill)
    wait = step(run_id, 1).wait
    assert wait is not None and wait.kind is WaitKind.SLEEP and wait.until is not None
    c.worker()
    sweep_until(c, "the run to wake and end", lambda: api.get_run(run_id).status.terminal)
    ledger = finished(c, [run_id])
    assert ledger.calls(f"{run_id}:1") == 1
    assert step(run_id, 1).result == {"slept": 2}
    (woke,) = [
        e for e in api.runtime().store.events(run_id) if e.step_index == 1 and e.to_status == "done"
    ]
    assert woke.at >= wait.until and woke.detail == "woke: its sleep ended"


# -- 7. child runs -----------------------------------------------------------


def children(run_id: str) -> list[Run]:
    return api.runtime().store.children(run_id)


@pytest.mark.parametrize("broker", BROKERS)
def test_a_child_is_started_once_across_sigkills_of_both_workers(
    make_cluster: MakeCluster, broker: str
) -> None:
    """The parent's worker dies right after its first delegation started the
    child (its result stored nowhere), the child's worker dies in the middle
    of the child's call: the redone delegation finds the same child, each
    child's call has its effect once, and both answers reach the parent."""
    c = waits_cluster(make_cluster, broker)
    c.beat()
    (run_id,) = c.start("w-planner")
    first, second = f"{run_id}:1", f"{run_id}:2"
    crash_worker(c, "after_tool_returned")
    assert [r.run_id for r in children(run_id)] == [first]  # started, not yet recorded
    assert step(run_id, 1).status is StepStatus.RUNNING

    w2 = c.worker("--concurrency=1")
    c.wait_until(
        "a child's call under way",
        lambda: any(k.startswith(f"{run_id}:") for k in c.ledger().unfinished(c.killed)),
    )
    c.kill(w2)
    c.worker()

    ledger = finished(c, [run_id])
    assert api.get_run(run_id).result == "planned"
    kids = children(run_id)
    assert [k.run_id for k in kids] == [first, second]
    for kid, index in zip(kids, (1, 2), strict=True):
        assert kid.status is RunStatus.COMPLETED and kid.result == "found it"
        assert kid.parent is not None and (kid.parent.run_id, kid.parent.step) == (run_id, index)
        assert ledger.effects(f"{kid.run_id}:1") == 1
        events = api.runtime().store.events(kid.run_id)
        created = [e for e in events if (e.from_status, e.to_status) == (None, "pending")]
        assert len(created) == 1, created
    assert sum(ledger.calls(f"{k.run_id}:1") for k in kids) == 3  # one was cut off and redone
    delegated = step(run_id, 1)
    assert delegated.attempts == 2 and delegated.result == "found it"
    assert step(run_id, 2).result == "found it"


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_a_childs_end_lost_with_its_process_still_reaches_its_parent(
    make_cluster: MakeCluster, broker: str
) -> None:
    """The worker that carried a child to its end dies before it gives the
    parent's step that end: the parent, waiting, is looked at by the sweeper,
    which finds the child ended and moves the parent on, once."""
    c = waits_cluster(make_cluster, broker)
    c.beat()
    (run_id,) = c.start("w-planner")
    crash_worker(c, "before_parent_answered")
    (kid,) = [k for k in children(run_id) if k.status.terminal]  # the worker died after it
    assert kid.parent is not None
    assert step(run_id, kid.parent.step).status is StepStatus.DEFERRED  # its end not given
    c.worker()
    finished(c, [run_id])
    assert api.get_run(run_id).result == "planned"
    for kid in children(run_id):
        assert kid.parent is not None
        answers = [
            e
            for e in api.runtime().store.events(run_id)
            if e.step_index == kid.parent.step and e.from_status == "deferred"
        ]
        assert len(answers) == 1, answers


@pytest.mark.parametrize("broker", BROKERS)
def test_a_childs_budget_is_capped_by_its_parents(make_cluster: MakeCluster, broker: str) -> None:
    """The planner (600 tokens) has used 150 when it delegates: the child may
    use the 450 left, fails when its next turn would pass them, and its usage
    counts on the parent, which stops before going over its own budget."""
    c = waits_cluster(make_cluster, broker)
    c.worker()
    (run_id,) = c.start("w-thrifty")
    (parent,) = c.wait_ended([run_id])
    (child,) = children(run_id)
    assert child.max_tokens == 450
    assert child.status is RunStatus.FAILED
    assert child.error == (
        "token budget: 450 used + 150 reserved for the next model call > max_tokens=450"
    )
    assert (child.input_tokens, child.output_tokens) == (300, 150)
    ledger = c.ledger()
    assert [ledger.effects(f"{child.run_id}:{i}") for i in (1, 3, 5)] == [1, 1, 1]
    delegated = step(run_id, 1)
    assert delegated.status is StepStatus.FAILED
    assert delegated.error is not None and delegated.error.startswith(f"child run {child.run_id}")
    assert parent.status is RunStatus.FAILED
    assert (parent.input_tokens, parent.output_tokens) == (400, 200)
    assert parent.error == (
        "token budget: 600 used + 150 reserved for the next model call > max_tokens=600"
    )


@pytest.mark.parametrize("broker", BROKERS)
def test_cancelling_a_parent_cancels_its_waiting_child(
    make_cluster: MakeCluster, broker: str
) -> None:
    c = waits_cluster(make_cluster, broker)
    c.worker()
    (run_id,) = c.start("w-boss")
    child_id = f"{run_id}:1"
    c.wait_until(
        "the child to wait for its signal",
        lambda: bool(children(run_id)) and deferred(child_id)(),
    )
    c.wait_until("the parent to wait for its child", deferred(run_id))
    harness.cancel_run(run_id, "the deal is off")
    assert api.get_run(run_id).status is RunStatus.CANCELLED
    assert api.get_run(child_id).status is RunStatus.CANCELLED
    with pytest.raises(DecisionConflict):
        harness.signal(child_id, "paid", {"amount": 1})
    assert c.ledger().calls(f"{child_id}:1") == 1
