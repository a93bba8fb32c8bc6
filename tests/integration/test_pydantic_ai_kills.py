"""A Pydantic AI agent's calls killed mid-way on real solo workers (the
embedded default, and PostgreSQL with Redis or RabbitMQ as the broker): an
idempotent call is made again, an ``at_most_once`` one is held in doubt, for
a function tool and for a tool of the agent's own MCP server. Apart from
tests/integration/test_pydantic_ai_workers.py so that the two files run on
two test processes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import api
from harness.records import RunStatus, StepStatus
from tests.cluster import Cluster
from tests.integration.test_pydantic_ai_workers import PAI_IMPORTS

pytestmark = pytest.mark.slow


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


def test_a_worker_killed_mid_call_of_its_mcp_servers_tool(
    make_cluster: Callable[..., Cluster],
) -> None:
    """The agent's own MCPToolset: an idempotent tool's call is made again
    under the same key (in the request's ``_meta``); an at_most_once one's
    (MCP's default) is held in doubt."""
    c = make_cluster("filesystem", HARNESS_IMPORTS=PAI_IMPORTS + ",tests.pydantic_mcp_agents")
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
