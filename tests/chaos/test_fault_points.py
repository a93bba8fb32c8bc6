"""Each named crash point, armed in a real worker: the worker SIGKILLs itself
there, a fresh worker recovers the run, and the ledger shows what ran where."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from harness import api
from harness.records import RunStatus
from tests.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@dataclass(frozen=True)
class Expect:
    point: str
    starts: int  # calls of the first tool step, across both workers
    effects: int  # of which completed their effect
    attempts: int  # of that step, as recorded


CASES = [
    # durably RUNNING, nothing called yet: the new owner makes the only call
    Expect("after_running_checkpoint.tool", starts=1, effects=1, attempts=2),
    # the model step is simply re-run
    Expect("after_running_checkpoint.model", starts=1, effects=1, attempts=1),
    # the call happened but its result was stored nowhere: the honest window
    # in which an idempotent tool runs again, with the same key
    Expect("after_tool_returned", starts=2, effects=2, attempts=2),
    # the result is committed, the next message never sent: the sweeper sends it
    Expect("after_result_checkpoint.tool", starts=1, effects=1, attempts=1),
    # killed mid-call by the heartbeat's crash: the call is made again
    Expect("during_lease_renewal", starts=2, effects=1, attempts=2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.point for c in CASES])
def test_crash_point(make_cluster: Callable[..., Cluster], case: Expect) -> None:
    c = make_cluster("filesystem")
    c.beat()
    doomed = c.worker(env={"HARNESS_CRASH_AT": case.point})
    (run_id,) = c.start("slow-chain")
    c.wait_until("the armed worker to kill itself", lambda: doomed.proc.poll() is not None)
    assert doomed.proc.returncode == -9
    c.kill(doomed)  # only notes it as killed, no later than now
    assert f"crash point {case.point.split('.')[0]} armed" in doomed.log()
    c.worker()
    first_tool = f"{run_id}:1"
    ledger = c.assert_completed_once([run_id])
    assert ledger.calls(first_tool) == case.starts
    assert ledger.effects(first_tool) == case.effects
    if case.starts > 1:
        assert ledger.by_key[first_tool][0].pid == doomed.pid
    step = api.get_steps(run_id)[1]
    assert step.attempts == case.attempts
    assert api.get_run(run_id).status is RunStatus.COMPLETED
