"""A run carried by real workers, exported and imported with the real CLI.

The embedded default (SQLite, ``filesystem://``): a ``chain`` run completes
on a worker; ``harness export`` writes it to a file; ``harness import`` puts
it into a second, empty SQLite store; ``harness show --json`` reads the same
in both, and importing executed nothing (the ledger counts every effect).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.records import RunStatus
from tests.cluster import Cluster

pytestmark = pytest.mark.slow

HARNESS = str(Path(sys.executable).with_name("harness"))


def harness_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [HARNESS, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done


def show(env: dict[str, str], run_id: str) -> Any:
    return json.loads(harness_cli(env, "show", run_id, "--json").stdout)


def test_a_worker_run_exported_and_imported_into_an_empty_store(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster("filesystem")
    c.worker()
    [run_id] = c.start("chain")
    [run] = c.wait_all([run_id])
    assert run.status is RunStatus.COMPLETED
    effects = len(c.ledger().executions)
    document = tmp_path / "run.json"

    harness_cli(c.env, "export", run_id, "--output", str(document))
    elsewhere = c.env | {"HARNESS_DATABASE_URL": f"sqlite:///{tmp_path / 'elsewhere.db'}"}
    imported = harness_cli(elsewhere, "import", str(document), "--json")
    again = harness_cli(elsewhere, "import", str(document), "--json")

    assert json.loads(imported.stdout) == {"run_id": run_id, "imported": True}
    assert json.loads(again.stdout) == {"run_id": run_id, "imported": False}
    original, copy = show(c.env, run_id), show(elsewhere, run_id)
    assert copy == original
    assert [s["kind"] for s in copy["steps"]] == ["model", "tool"] * 3 + ["model"]
    ledger = c.ledger()
    assert len(ledger.executions) == effects  # importing called no tool
    assert [ledger.effects(f"{run_id}:{i}") for i in (1, 3, 5)] == [1, 1, 1]
