"""`harness health --worker`: the worker heartbeat file read by a supervisor;
`harness health --sweeps`: the sweeps the store recorded; `harness health`: the run store."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from harness import api
from harness.celery import health
from harness.cli import main
from harness.settings import Settings
from harness.store import Store, Sweep, SweepKind
from harness.store.migrate import head_revision


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


def test_one_check_at_a_time() -> None:
    result = cli("--worker", "--sweeps")
    assert result.exit_code == 2
    assert "one check at a time: --worker or --sweeps" in result.output


# -- --sweeps --------------------------------------------------------------------


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> Store:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_SWEEP_INTERVAL", "5")
    return api.runtime().store


def test_no_sweep_recorded_is_unhealthy_and_says_why(store: Store) -> None:
    result = cli("--sweeps")
    assert result.exit_code == 1
    assert result.output == (
        "unhealthy: no sweep recorded: is `celery beat` running? "
        "(workers take the sweep over once up for 15s)\n"
    )


def test_a_recent_sweep_by_beat_is_healthy(store: Store) -> None:
    store.record_sweep(Sweep(SweepKind.BEAT, "host:7:abc", time.time() - 3, time.time()))
    result = cli("--sweeps")
    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"healthy: last sweep 3\.\ds ago by beat host:7:abc\n", result.output)


def test_a_worker_sweeping_in_beats_place_is_healthy_and_says_so(store: Store) -> None:
    store.record_sweep(Sweep(SweepKind.BEAT, "host:7:abc", time.time() - 60, time.time() - 60))
    store.record_sweep(Sweep(SweepKind.WORKER, "w1@host:9", time.time() - 1, time.time()))
    result = cli("--sweeps")
    assert result.exit_code == 0, result.output
    assert result.output.endswith(
        "by worker w1@host:9, in beat's place (no beat sweep for 60s: is `celery beat` running?)\n"
    )


def test_an_old_sweep_is_unhealthy(store: Store) -> None:
    store.record_sweep(Sweep(SweepKind.WORKER, "w1@host:9", time.time() - 25, time.time() - 25))
    result = cli("--sweeps")
    assert result.exit_code == 1
    assert "older than 20s: neither beat nor a worker sweeps" in result.output
    assert cli("--sweeps", "--max-age", "30").exit_code == 0
    data = json.loads(cli("--sweeps", "--json").output)
    assert data["healthy"] is False and data["last_sweep_kind"] == "worker"
    assert data["last_sweep_worker"] == "w1@host:9" and data["beat_sweep_age_s"] is None
    assert data["max_age"] == 20.0 and 25 <= data["last_sweep_age_s"] < 30


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
