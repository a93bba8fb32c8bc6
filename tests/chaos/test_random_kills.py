"""Random SIGKILLs of pool children and whole workers on every broker, among
runs that make calls, runs that wait on the world (a callback, a signal,
a sleep, child runs), a run whose tools are MCP servers' and a Pydantic AI
agent's run.

A small run for `make test`; `make soak` runs the same driver for minutes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from tests.chaos.driver import ECOSYSTEM, WAITING, Chaos, write_report
from tests.cluster import Cluster
from tests.wait_agents import ENV

#: The chaos runs, the runs that wait, and the ecosystem's (an MCP agent, a Pydantic AI agent).
IMPORTS = ENV["HARNESS_IMPORTS"] + ",tests.mcp_agents,tests.pydantic_agents"

BROKERS = ["filesystem", "redis", "rabbitmq"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("broker", BROKERS)
def test_runs_survive_random_kills(make_cluster: Callable[..., Cluster], broker: str) -> None:
    chaos = Chaos(make_cluster(broker, **ENV | {"HARNESS_IMPORTS": IMPORTS}), broker, seed=7)
    chaos.run(runs=8, kill_every=(1.0, 2.0), max_seconds=25, also=WAITING + ECOSYSTEM)
    report = chaos.verify()
    write_report(report)
    assert report.child_kills + report.worker_kills >= 3
    assert report.runs == 8 + len(WAITING) + len(ECOSYSTEM)
    assert report.callbacks >= 1 and report.signals == 1


@pytest.mark.soak
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("broker", BROKERS)
def test_soak(make_cluster: Callable[..., Cluster], broker: str) -> None:
    """Rounds of 12 runs, and runs that wait, under random kills for
    HARNESS_TEST_SOAK_SECONDS (default 600)."""
    seconds = float(os.environ.get("HARNESS_TEST_SOAK_SECONDS", "600"))
    chaos = Chaos(make_cluster(broker, **ENV), broker, workers=3, seed=11)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        left = min(60, end - time.monotonic())
        chaos.run(runs=12, kill_every=(1.0, 3.0), max_seconds=left, also=WAITING)
    report = chaos.verify()
    write_report(report)
    assert report.runs >= 12
