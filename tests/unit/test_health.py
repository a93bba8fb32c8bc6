"""`harness health --worker`: the worker heartbeat file read by a supervisor;
`harness health`: the run store."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from harness.cli import main
from harness.settings import Settings
from harness.store.migrate import head_revision
from harness.worker import health


@pytest.fixture
def beat_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    path = tmp_path / "w1.heartbeat"
    monkeypatch.setenv("HARNESS_WORKER_HEARTBEAT_FILE", str(path))
    return path


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, ["health", *args])


def test_a_fresh_heartbeat_is_healthy(beat_file: Path) -> None:
    health.write(beat_file, "w1@host")
    result = cli("--worker")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("healthy: worker w1@host (pid ")
    assert len(result.output.splitlines()) == 1


def test_an_old_heartbeat_is_unhealthy(beat_file: Path) -> None:
    health.write(beat_file, "w1@host")
    old = time.time() - 45
    os.utime(beat_file, (old, old))
    result = cli("--worker")
    assert result.exit_code == 1
    assert result.output.startswith("unhealthy: worker w1@host")
    assert "older than 30s" in result.output
    assert cli("--worker", "--max-age", "60").exit_code == 0


def test_a_missing_heartbeat_is_unhealthy(beat_file: Path) -> None:
    result = cli("--worker")
    assert result.exit_code == 1
    assert result.output == f"unhealthy: no worker heartbeat at {beat_file}\n"


def test_json_says_the_same(beat_file: Path) -> None:
    missing = cli("--worker", "--json")
    assert missing.exit_code == 1
    assert json.loads(missing.output) == {
        "healthy": False,
        "path": str(beat_file),
        "max_age": 30.0,
        "age": None,
        "worker": None,
        "pid": None,
    }
    health.write(beat_file, "w1@host")
    fresh = cli("--worker", "--json", "--max-age", "5")
    assert fresh.exit_code == 0
    data = json.loads(fresh.output)
    assert data["healthy"] is True and data["worker"] == "w1@host" and data["pid"] == os.getpid()
    assert 0 <= data["age"] <= 5


def test_without_worker_it_checks_the_run_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`harness health` alone: the store answers at the newest revision (issue 21);
    it makes nothing, not even the embedded default's file."""
    db = tmp_path / "h.db"
    monkeypatch.setenv("HARNESS_DATABASE_URL", f"sqlite:///{db}")
    missing = cli()
    assert missing.exit_code == 1
    assert missing.output.startswith(f"unhealthy: no run store at sqlite:///{db}: ")
    assert not db.exists()
    assert CliRunner().invoke(main, ["migrate"]).exit_code == 0
    result = cli()
    assert result.exit_code == 0, result.output
    assert result.output == f"healthy: run store sqlite:///{db} at revision {head_revision()}\n"
    assert json.loads(cli("--json").output) == {
        "healthy": True,
        "store": f"sqlite:///{db}",
        "revision": head_revision(),
        "error": None,
    }


def test_the_default_file_is_under_harness_home(tmp_path: Path) -> None:
    s = Settings.from_env({"HARNESS_HOME": str(tmp_path)})
    assert s.worker_heartbeat_file == tmp_path / "health" / "worker.heartbeat"
    named = Settings.from_env({"HARNESS_WORKER_HEARTBEAT_FILE": str(tmp_path / "x")})
    assert named.worker_heartbeat_file == tmp_path / "x"


def test_touch_refreshes_and_recreates(tmp_path: Path) -> None:
    path = tmp_path / "health" / "hb"
    health.touch(path, "w1@host")  # missing: written whole
    assert json.loads(path.read_text())["worker"] == "w1@host"
    old = time.time() - 100
    os.utime(path, (old, old))
    health.touch(path, "w1@host")
    assert health.check(path, max_age=5).healthy
