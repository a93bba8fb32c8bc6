"""A Pydantic AI agent on real solo workers, SIGKILLed at every step
boundary (the embedded default: SQLite, the filesystem broker): it completes
with the plain run's output, each model turn bought once and each tool call
repeated only after a kill of the process making it; a worker killed in the
agent's own code after a response does not buy it again. Calls killed mid
way: tests/integration/test_pydantic_ai_kills.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from harness import api
from harness.records import RunStatus
from tests.cluster import IMPORTS, Cluster
from tests.pydantic_agents import weather_agent

pytestmark = pytest.mark.slow

PAI_IMPORTS = IMPORTS + ",tests.pydantic_agents"
#: Every boundary of a step a worker can die at (harness.faults), armed in turn.
BOUNDARIES = (
    "after_running_checkpoint",
    "after_model_returned",
    "after_tool_returned",
    "after_result_checkpoint",
)


def _models(c: Cluster) -> Counter[str]:
    """How many times each model turn was bought, counted from outside."""
    path = c.ledger_path.with_name(c.ledger_path.name + ".models")
    return Counter(line.split()[1] for line in path.read_text().splitlines())


def test_a_run_killed_at_every_step_boundary_completes_buying_each_turn_once(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster("filesystem", HARNESS_IMPORTS=PAI_IMPORTS)
    c.beat()
    run_id = api.start_run("pai-weather", "weather in oslo")
    deaths = 0
    while not api.get_run(run_id).status.terminal:
        # Each worker SIGKILLs itself the first time it reaches its boundary.
        point = BOUNDARIES[deaths % len(BOUNDARIES)]
        doomed = c.worker("--pool=solo", env={"HARNESS_CRASH_AT": point})
        c.wait_until(
            "a worker to die or the run to end",
            lambda w=doomed: w.proc.poll() is not None or api.get_run(run_id).status.terminal,
            timeout=60,
        )
        if doomed.proc.poll() is not None:
            deaths += 1
        c.kill(doomed)
        assert deaths < 30, c.logs()
    run = api.get_run(run_id)
    assert run.status is RunStatus.COMPLETED, (run.error, c.logs())
    assert deaths >= 6  # a death at each step's boundaries, at least
    plain = weather_agent("plain").run_sync("weather in oslo").output
    steps = api.get_steps(run_id)
    assert steps[-1].result["final"] == plain.model_dump()
    assert [s.kind for s in steps] == ["model", "tool", "model", "tool", "model", "model"]
    # The plain run above noted its own four turns: each turn of the run, once more.
    assert set(_models(c).values()) == {2}, _models(c)
    ledger = c.ledger()
    assert ledger.unjustified_repeats(c.killed) == [] and ledger.overlapping(c.killed) == []
    assert all(ledger.effects(s.idempotency_key) >= 1 for s in steps if s.kind == "tool")


def test_a_worker_killed_in_the_agents_code_after_a_response_does_not_buy_it_again(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster("filesystem", HARNESS_IMPORTS=PAI_IMPORTS, HARNESS_TEST_TOOL_SECONDS="3")
    c.beat()
    worker = c.worker("--pool=solo")
    run_id = api.start_run("pai-checker", "check this")
    key = "validate:check_this"
    c.wait_until("the validator under way", lambda: key in c.ledger().unfinished(c.killed))
    c.kill(worker)
    c.worker("--pool=solo")
    (run,) = c.wait_all([run_id], timeout=90)
    assert run.status is RunStatus.COMPLETED, (run.error, c.logs())
    assert run.result == "checked"
    assert _models(c) == {"check_this/0": 1}  # recorded before the validator ran
