"""Real providers in real workers: a SIGKILL after a response was bought, a
durable retry that frees the worker, a crash while a step waits, rate
limits shared by several workers, and a cancel while a call is under way.
The providers are the official SDKs talking HTTP to a local server of both
wire formats (tests.wire), started here; it counts what was called and what
was billed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from harness import api
from harness.records import RunStatus
from tests.cluster import Cluster
from tests.wire import WireServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def effect_then_answer(n: int, **first: Any) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "effect", "args": {"n": n}}], **first},
        {"text": f"effect {n} done"},
    ]


@pytest.mark.parametrize(("broker", "bot"), [("filesystem", "openai"), ("redis", "anthropic")])
def test_a_sigkill_after_the_response_does_not_buy_it_again(
    make_cluster: Callable[..., Cluster], wire: WireServer, broker: str, bot: str
) -> None:
    c = make_cluster(broker)
    c.beat()
    wire.script("buy once", effect_then_answer(1))
    # One process (solo pool): the crash point kills the whole worker.
    doomed = c.worker("--pool=solo", env={"HARNESS_CRASH_AT": "after_model_returned"})
    run_id = api.start_run(f"{bot}-bot", "buy once")
    c.wait_until("the armed worker to kill itself", lambda: doomed.proc.poll() is not None)
    assert doomed.proc.returncode == -9
    c.kill(doomed)
    c.worker()
    c.assert_completed_once([run_id])
    # The response recorded before the kill was read back, not bought again.
    assert (wire.billed("buy once", 0), wire.calls("buy once", 0)) == (1, 1)
    assert wire.billed("buy once", 1) == 1
    run = api.reads().run_detail(run_id).to_dict()
    assert run["usage"] == {"input_tokens": 30, "output_tokens": 10}  # the server's 10+20, 5+5


@pytest.mark.postgres
@pytest.mark.redis
def test_a_rate_limited_step_waits_in_sql_and_frees_its_worker(
    make_cluster: Callable[..., Cluster], wire: WireServer
) -> None:
    """One worker slot. The first run is told 429, retry after 4 s; the second
    runs to completion meanwhile in that slot, which a retry sleeping in the
    worker would hold."""
    c = make_cluster("redis")
    c.worker("--concurrency=1")
    wire.script("told to wait", [{"text": "waited", "faults": [{"status": 429, "retry_after": 4}]}])
    wire.script("meanwhile", [{"text": "quick"}])
    waiting = api.start_run("openai-bot", "told to wait")
    c.wait_until("the 429", lambda: wire.calls("told to wait", 0) == 1)
    quick = api.start_run("openai-bot", "meanwhile")
    (done,) = c.wait_all([quick], timeout=30)
    assert done.status is RunStatus.COMPLETED
    assert not api.get_run(waiting).status.terminal  # still waiting for its retry
    step = api.get_steps(waiting)[0]
    assert (step.status, step.retries, step.attempts) == ("pending", 1, 0)
    (finished,) = c.wait_all([waiting], timeout=60)
    assert finished.status is RunStatus.COMPLETED
    assert (wire.calls("told to wait", 0), wire.billed("told to wait", 0)) == (2, 1)


def test_a_worker_killed_while_a_step_waits_loses_nothing(
    make_cluster: Callable[..., Cluster], wire: WireServer
) -> None:
    """On the embedded broker the delayed message dies with the worker that
    held it; the wake-up is in SQL, and the sweeper keeps it."""
    c = make_cluster("filesystem")
    c.beat()
    first = c.worker()
    wire.script("waits", [{"text": "woken", "faults": [{"status": 503, "retry_after": 2}]}])
    run_id = api.start_run("anthropic-bot", "waits")
    c.wait_until(
        "the retry to be scheduled", lambda: api.get_steps(run_id)[0].retries == 1, timeout=30
    )
    c.kill(first)
    c.worker()
    (run,) = c.wait_all([run_id], timeout=60)
    assert run.status is RunStatus.COMPLETED, run.error
    assert (wire.calls("waits", 0), wire.billed("waits", 0)) == (2, 1)


@pytest.mark.postgres
@pytest.mark.redis
def test_rate_limits_hold_across_workers(
    make_cluster: Callable[..., Cluster], wire: WireServer
) -> None:
    """Three workers, eight runs of two model turns each, against a limit of
    4 requests per 2 s window: no window of the server's clock sees more."""
    limit, window = 4, 2.0
    c = make_cluster(
        "redis",
        HARNESS_RATE_LIMITS=f"openai:*={limit}rpm",
        HARNESS_RATE_WINDOW=str(window),
    )
    c.beat()
    for _ in range(3):
        c.worker("--concurrency=2")
    goals = [f"limited {i}" for i in range(8)]
    for i, goal in enumerate(goals):
        wire.script(goal, effect_then_answer(i))
    run_ids = [api.start_run("openai-bot", goal) for goal in goals]
    c.assert_completed_once(run_ids)
    assert len(wire.requests) == 16
    assert wire.max_per_window(window) <= limit
    waits = sum(
        1
        for run_id in run_ids
        for e in api.reads().store.events(run_id)
        if e.to_status == "rate_limited"
    )
    assert waits > 0  # the limit did bite


@pytest.mark.postgres
@pytest.mark.redis
def test_a_cancel_mid_call_keeps_what_the_call_cost(
    make_cluster: Callable[..., Cluster], wire: WireServer
) -> None:
    """The review's case: cancelled while its model call is under way, the run
    showed none of the 5,000 + 4,000 tokens the call was billed. The call's
    usage is charged to the cancelled run when it returns, once."""
    c = make_cluster("redis")
    c.worker()
    usage = {"input_tokens": 5000, "output_tokens": 4000}
    wire.script("mid-call", [{"text": "too late", "usage": usage, "faults": [{"delay": 2.0}]}])
    run_id = api.start_run("openai-bot", "mid-call")
    c.wait_until("the call to reach the provider", lambda: wire.calls("mid-call", 0) == 1)
    assert api.cancel_run(run_id, "changed my mind").status is RunStatus.CANCELLED
    c.wait_until("the call's usage", lambda: api.get_run(run_id).input_tokens > 0)
    run = api.get_run(run_id)
    assert (run.status, run.input_tokens, run.output_tokens) == (RunStatus.CANCELLED, 5000, 4000)
    assert api.get_steps(run_id)[0].to_dict()["usage"] == usage
    events = [e.to_status for e in api.reads().store.events(run_id)]
    assert events.count("billed") == 1
    assert wire.billed("mid-call", 0) == 1
