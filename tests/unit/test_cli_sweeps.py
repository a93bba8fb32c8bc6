"""What the command line says about sweeps: ``stats`` (the last sweep's age,
and a warning while no one sweeps), ``show`` and ``list`` (a run whose lease
lapsed with no sweep since), and a step abandoned in a run that ended."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from harness import api
from harness.cli import main
from harness.engine import transitions
from harness.store import Sweep, SweepKind
from tests.rig import insert_run

UNSWEPT = "no sweep has run since: is `celery beat` running? (`harness sweep` recovers it now)"


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    monkeypatch.setenv("HARNESS_SWEEP_INTERVAL", "5")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def ok_json(*args: str) -> Any:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def dead_worker_run(lapsed_ago: float) -> str:
    """A run whose worker claimed its first step and died; its lease lapsed ``lapsed_ago`` s ago."""
    store = api.runtime().store
    run = insert_run(store, "r1")
    assert run.current is not None
    claim = transitions.claim(
        run, run.current, worker="w1@host:9/1", now=time.time() - lapsed_ago - 10, ttl=10
    )
    store.checkpoint(claim)
    return run.run_id


def test_stats_carry_the_last_sweeps_age_and_warn_while_no_one_sweeps() -> None:
    stats = ok_json("stats", "--json")
    assert stats["last_sweep_age_s"] is None and stats["last_sweep_kind"] is None
    text = cli("stats")
    assert text.exit_code == 0
    assert "last_sweep_age_s                 None" in text.stdout
    assert text.stderr.startswith("sweeps: unhealthy: no sweep recorded: is `celery beat` running?")
    assert ok_json("sweep", "--json") == []
    stats = ok_json("stats", "--json")
    assert 0 <= stats["last_sweep_age_s"] < 5 and stats["last_sweep_kind"] == "command"
    assert cli("stats").stderr == ""  # a sweep by hand, just now: nothing to say


def test_stats_say_when_a_worker_sweeps_in_beats_place() -> None:
    api.runtime().store.record_sweep(Sweep(SweepKind.WORKER, "w2@host:5", time.time(), time.time()))
    assert "in beat's place (no beat sweep recorded: is" in cli("stats").stderr


def test_show_and_list_call_out_a_lapsed_lease_with_no_sweep_since() -> None:
    run_id = dead_worker_run(lapsed_ago=62)
    shown = " ".join(cli("show", run_id).stdout.split())  # as wrapped to the terminal
    assert re.search(
        rf"attention \(unswept\): lease expired 6\ds ago and {re.escape(UNSWEPT)}", shown
    )
    data = ok_json("show", run_id, "--json")
    assert data["attention"] == "unswept" and data["attention_detail"].endswith(UNSWEPT)
    (listed,) = ok_json("list", "--json")
    assert (listed["run_id"], listed["attention"]) == (run_id, "unswept")
    assert "unswept" in cli("list").stdout
    ok_json("sweep", "--json")  # recovers it: no longer unswept
    assert ok_json("show", run_id, "--json")["attention"] is None


def test_a_step_running_when_its_run_was_cancelled_shows_abandoned() -> None:
    run_id = dead_worker_run(lapsed_ago=0)
    step = ok_json("show", run_id, "--json")["steps"][0]
    assert (step["status"], step["abandoned"]) == ("running", False)
    assert ok_json("cancel", run_id, "--json")["status"] == "cancelled"
    step = ok_json("show", run_id, "--json")["steps"][0]
    assert (step["status"], step["abandoned"]) == ("running", True)
    table = cli("show", run_id).stdout
    assert "abandoned" in table and " running " not in table
