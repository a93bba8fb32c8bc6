"""A Pydantic AI agent on real solo workers, SIGKILLed at every step
boundary (the embedded default: SQLite, the filesystem broker) and mid call
(there, and on PostgreSQL with Redis or RabbitMQ as the broker): it
completes with the plain run's output, each model turn bought once and each
tool call repeated only after a kill of the process making it; an
``at_most_once`` tool killed mid call goes in doubt; a worker killed in the
agent's own code after a response does not buy it again."""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import api
from harness.records import RunStatus, StepStatus
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


@pytest.mark.parametrize(
    "broker",
    [
        "filesystem",
        pytest.param("redis", marks=(pytest.mark.postgres, pytest.mark.redis)),
        pytest.param(
            "rabbitmq", marks=(pytest.mark.postgres, pytest.mark.redis, pytest.mark.rabbitmq)
        ),
    ],
)
def test_a_call_killed_mid_way_is_repeated_or_held_per_its_effect(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    c = make_cluster(broker, HARNESS_IMPORTS=PAI_IMPORTS, HARNESS_TEST_TOOL_SECONDS="3")
    c.beat()
    worker = c.worker("--pool=solo")
    (weather,) = [api.start_run("pai-weather", "weather mid call")]
    key = f"{weather}:1"
    c.wait_until("the call under way", lambda: key in c.ledger().unfinished(c.killed))
    c.kill(worker)
    worker = c.worker("--pool=solo")
    mailer = api.start_run("pai-mailer", "mail")
    sent = f"{mailer}:1"
    c.wait_until("the mail under way", lambda: sent in c.ledger().unfinished(c.killed))
    c.kill(worker)
    c.worker("--pool=solo")
    done, held = c.wait_all([weather, mailer], timeout=90)
    assert done.status is RunStatus.COMPLETED, done.error
    assert held.status is RunStatus.WAITING
    assert api.get_steps(mailer)[1].status == "in_doubt"
    ledger = c.ledger()
    assert ledger.unjustified_repeats(c.killed) == [] and ledger.overlapping(c.killed) == []
    assert (ledger.calls(key), ledger.effects(key)) == (2, 1)  # idempotent: called again
    assert (ledger.calls(sent), ledger.effects(sent)) == (1, 0)  # at most once: held


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


def test_a_worker_killed_mid_call_of_its_mcp_servers_tool(
    make_cluster: Callable[..., Cluster],
) -> None:
    """The agent's own MCPToolset: an idempotent tool's call is made again
    under the same key (in the request's ``_meta``); an at_most_once one's
    (MCP's default) is held in doubt."""
    c = make_cluster("filesystem", HARNESS_IMPORTS=PAI_IMPORTS)
    c.beat()
    workers = [c.worker("--pool=solo"), c.worker("--pool=solo")]
    held = Path(str(c.ledger_path) + ".hold")
    held.touch()
    note_run, send_run = api.start_run("pai-mcp-note", "n"), api.start_run("pai-mcp-send", "s")
    note_key, send_key = f"{note_run}:1", f"{send_run}:1"
    c.wait_until(
        "both calls under way",
        lambda: c.ledger().calls(note_key) >= 1 and c.ledger().calls(send_key) >= 1,
    )
    servers = {c.ledger().by_key[key][0].pid for key in (note_key, send_key)}
    try:
        for worker in workers:
            c.kill(worker)
        held.unlink()
        c.worker("--pool=solo")
        (done,) = c.wait_all([note_run], timeout=90)
        assert done.status is RunStatus.COMPLETED, (done.error, c.logs())
        assert done.result == "done"
        assert c.ledger().calls(note_key) == 2  # the same key both times: a server can dedupe
        c.wait_until(
            "the send in doubt",
            lambda: api.get_steps(send_run)[1].status is StepStatus.IN_DOUBT,
            timeout=60,
        )
        assert c.ledger().calls(send_key) == 1
        assert api.get_run(send_run).status is RunStatus.WAITING
    finally:
        for pid in servers:  # a server whose worker was killed outlives it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
