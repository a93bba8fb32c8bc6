"""``harness agents`` and ``harness start`` against the catalog, on the
embedded store (no worker runs: the workers' rows are written as a worker
publishes them, with the time it would)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from harness import api
from harness.catalog import LIVE
from harness.cli import main
from harness.store import PublishedAgent, PublishedTool
from harness.store.sql import SQLStore
from tests.unit.test_cli import assert_one_line_error

REMOTE_TOOLS = (
    PublishedTool("lookup", "read_only", False),
    PublishedTool("pay", "idempotent", True),
)


@pytest.fixture
def store(
    monkeypatch: pytest.MonkeyPatch, sqlite_store: SQLStore, sqlite_url: str, tmp_path: Path
) -> SQLStore:
    """The embedded setup with the test agents registered here."""
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    return sqlite_store


def publish(store: SQLStore, worker: str, agent: str, definition: str, ago: float = 1.0) -> float:
    seen = round(time.time() - ago, 3)
    row = PublishedAgent(worker, agent, definition, REMOTE_TOOLS, seen - 60, seen)
    store.publish_agents(worker, [row], forget_before=0.0)
    return seen


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_agents_lists_what_live_workers_carry(store: SQLStore) -> None:
    seen1 = publish(store, "w1@host", "remote", "sha256:" + "a" * 64)
    seen2 = publish(store, "w2@host", "remote", "sha256:" + "a" * 64, ago=2.0)
    publish(store, "dead@host", "gone", "sha256:" + "c" * 64, ago=LIVE + 5)
    result = cli("agents", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {
            "name": "remote",
            "tools": [
                {"name": "lookup", "effect": "read_only", "requires_approval": False},
                {"name": "pay", "effect": "idempotent", "requires_approval": True},
            ],
            "definition_hash": "sha256:" + "a" * 64,
            "mixed_release": False,
            "workers": [
                {"name": "w1@host", "last_seen": seen1, "definition_hash": "sha256:" + "a" * 64},
                {"name": "w2@host", "last_seen": seen2, "definition_hash": "sha256:" + "a" * 64},
            ],
        }
    ]
    text = cli("agents")
    assert text.exit_code == 0, text.output
    assert "remote" in text.stdout and "aaaaaaaaaaaa" in text.stdout
    assert "lookup (read_only)" in text.stdout and "pay (idempotent, approval)" in text.stdout
    assert "w1@host" in text.stdout and "w2@host" in text.stdout
    assert "gone" not in text.stdout and "mixed" not in text.stdout


def test_agents_marks_a_mixed_release(store: SQLStore) -> None:
    publish(store, "old@host", "remote", "sha256:" + "a" * 64)
    publish(store, "new@host", "remote", "sha256:" + "b" * 64)
    result = cli("agents")
    assert result.exit_code == 0, result.output
    assert "mixed release: 2 definitions" in result.stdout
    (entry,) = json.loads(cli("agents", "--json").stdout)
    assert entry["mixed_release"] is True
    hashes = {w["name"]: w["definition_hash"][7:8] for w in entry["workers"]}
    assert hashes == {"new@host": "b", "old@host": "a"}


def test_agents_with_no_live_worker_says_so(store: SQLStore) -> None:
    assert json.loads(cli("agents", "--json").stdout) == []
    result = cli("agents")
    assert result.exit_code == 0, result.output
    assert "no live worker has published an agent" in result.stdout


def test_start_accepts_an_agent_only_a_live_worker_carries(store: SQLStore) -> None:
    publish(store, "w1@host", "remote", "sha256:" + "a" * 64)
    result = cli("start", "remote", "a goal far away", "--json")
    assert result.exit_code == 0, result.output
    run = api.get_run(json.loads(result.stdout)["run_id"])
    assert (run.agent, run.goal, run.status) == ("remote", "a goal far away", "pending")


def test_start_refuses_an_agent_no_live_worker_carries_with_the_known_agents(
    store: SQLStore,
) -> None:
    publish(store, "w1@host", "remote", "sha256:" + "a" * 64)
    publish(store, "dead@host", "gone", "sha256:" + "c" * 64, ago=LIVE + 5)
    for name in ("nobody", "gone"):
        result = cli("start", name, "goal", "--json")
        assert_one_line_error(result, f"no agent named {name!r}", "known agents", "remote", "chain")
        known = result.stderr.split(";")[1].split(":", 1)[1]  # " known agents: a, b"
        assert "gone" not in [name.strip() for name in known.split(",")]
    assert json.loads(cli("list", "--json").stdout) == []
