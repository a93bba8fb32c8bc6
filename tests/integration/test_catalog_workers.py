"""Runs of agents whose code only the workers have (harness.catalog).

A real ``celery -A tasks worker`` imports an agent module that neither this
test process nor the ``harness`` processes it starts can import: they find
the agent in the catalog the worker published to the store when it started,
and the run is carried by that worker. On the embedded default (SQLite and
the ``filesystem://`` broker), and end to end on PostgreSQL with Redis too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.celery.process import WorkerProcess
from tests.apiserver import HARNESS, ApiServer
from tests.cluster import REPO, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REMOTE = '''
"""Agents only the workers import (HARNESS_IMPORTS=remote_agents)."""
import os

import harness


@harness.tool(effect="read_only")
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


harness.register_agent(
    harness.Agent(
        name="remote-echo",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "shout", "args": {"text": "hi"}}]}, {"final": "echoed"}]
        ),
        tools=[shout],
        max_steps=int(os.environ.get("REMOTE_MAX_STEPS", "10")),
    )
)
'''


def _with_agent_code(make_cluster: Callable[..., Cluster], tmp_path: Path, broker: str) -> Cluster:
    code = tmp_path / "agentcode"
    code.mkdir()
    (code / "remote_agents.py").write_text(REMOTE)
    return make_cluster(broker)


@pytest.fixture
def embedded(make_cluster: Callable[..., Cluster], tmp_path: Path) -> Cluster:
    return _with_agent_code(make_cluster, tmp_path, "filesystem")


@pytest.fixture(params=["filesystem", "redis"])
def each_store(
    request: pytest.FixtureRequest, make_cluster: Callable[..., Cluster], tmp_path: Path
) -> Cluster:
    """The embedded default (SQLite), and PostgreSQL with a Redis broker."""
    return _with_agent_code(make_cluster, tmp_path, request.param)


def remote_worker(c: Cluster, **env: str) -> WorkerProcess:
    """A worker that carries ``remote_agents`` (and not the test agents)."""
    code = c.home.parent / "agentcode"
    path = f"{REPO}{os.pathsep}{code}"
    return c.worker(env={"HARNESS_IMPORTS": "remote_agents", "PYTHONPATH": path, **env})


def elsewhere(c: Cluster) -> tuple[dict[str, str], Path]:
    """The environment and folder of a `harness` process that cannot import
    ``remote_agents``: its HARNESS_IMPORTS has only the test agents."""
    folder = c.home / "elsewhere"
    folder.mkdir(exist_ok=True)
    return c.env | {"HARNESS_IMPORTS": "tests.agents"}, folder


def harness(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env, folder = elsewhere(c)
    return subprocess.run(
        [HARNESS, *args], env=env, cwd=folder, capture_output=True, text=True, timeout=90
    )


def harness_json(c: Cluster, *args: str) -> Any:
    done = harness(c, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_cli_starts_a_run_of_an_agent_only_a_worker_carries(each_store: Cluster) -> None:
    embedded = each_store  # the same steps on each store
    remote_worker(embedded)
    (listed,) = harness_json(embedded, "agents")
    assert listed["name"] == "remote-echo"
    assert listed["tools"] == [{"name": "shout", "effect": "read_only", "requires_approval": False}]
    assert [w["name"].split("@")[0] for w in listed["workers"]] == ["w1"]
    run_id = harness_json(embedded, "start", "remote-echo", "say hi")["run_id"]
    run = harness_json(embedded, "wait", run_id, "--timeout", "60")
    assert (run["status"], run["result"]) == ("completed", "echoed"), embedded.logs()
    refused = harness(embedded, "start", "nobody", "a goal")
    assert (refused.returncode, refused.stdout) == (1, "")
    (line,) = refused.stderr.splitlines()
    assert line.startswith("error: no agent named 'nobody'; known agents")
    assert "remote-echo" in line and "chain" in line  # a worker's, and one registered here
    assert "remote_agents" not in sys.modules


def test_the_api_starts_a_run_of_an_agent_only_a_worker_carries(embedded: Cluster) -> None:
    remote_worker(embedded)
    env, folder = elsewhere(embedded)
    server = ApiServer(env | {"HARNESS_IMPORTS": ""}, folder)
    try:
        with server.client() as client:
            (listed,) = client.get("/api/agents").json()
            assert listed["name"] == "remote-echo" and not listed["mixed_release"]
            created = client.post("/api/runs", json={"agent": "remote-echo", "goal": "say hi"})
            assert created.status_code == 201, created.text
            refused = client.post("/api/runs", json={"agent": "nobody", "goal": "a goal"})
            assert refused.status_code == 422
            assert "remote-echo" in refused.json()["detail"]
        with server.client(anonymous=True) as anonymous:
            assert anonymous.get("/api/agents").status_code == 401
    finally:
        server.stop()
    run = harness_json(embedded, "wait", created.json()["run_id"], "--timeout", "60")
    assert run["status"] == "completed", embedded.logs()


def test_a_worker_that_stops_withdraws_its_agents(embedded: Cluster) -> None:
    first = remote_worker(embedded)
    remote_worker(embedded)
    (listed,) = harness_json(embedded, "agents")
    assert sorted(w["name"].split("@")[0] for w in listed["workers"]) == ["w1", "w2"]
    first.stop()
    (listed,) = harness_json(embedded, "agents")
    assert [w["name"].split("@")[0] for w in listed["workers"]] == ["w2"]


def test_a_mixed_release_is_logged_and_shown(embedded: Cluster) -> None:
    remote_worker(embedded, REMOTE_MAX_STEPS="10")
    newer = remote_worker(embedded, REMOTE_MAX_STEPS="20")
    warning = [line for line in newer.log().splitlines() if "mixed release" in line]
    assert len(warning) == 1, newer.log()
    assert "WARNING" in warning[0] and "remote-echo" in warning[0]
    assert "w1@" in warning[0] and "w2@" in warning[0]
    shown = harness(embedded, "agents")
    assert shown.returncode == 0, shown.stderr
    assert "mixed release: 2 definitions" in shown.stdout
    (listed,) = harness_json(embedded, "agents")
    assert len({w["definition_hash"] for w in listed["workers"]}) == 2
