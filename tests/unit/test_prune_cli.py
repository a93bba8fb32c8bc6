"""``harness prune`` on the embedded store: its output, its JSON, its errors."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner, Result

from harness.cli import main
from harness.store.migrate import upgrade
from harness.store.sql import make_engine
from tests.seeding import Seed, row_counts, seed
from tests.unit.test_cli import assert_one_line_error


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> str:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    engine = make_engine(sqlite_url)
    upgrade(engine)
    seed(
        engine,
        [
            Seed("old-1"),
            Seed("old-2", "failed"),
            Seed("parent"),
            Seed("child", forked_from="parent", age=3600),
            Seed("moving", "running"),
        ],
        time.time(),
    )
    engine.dispose()
    return sqlite_url


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, ["prune", *args])


def test_dry_run_json_reports_and_deletes_nothing(seeded: str) -> None:
    engine = make_engine(seeded)
    before = row_counts(engine)
    result = cli("--older-than", "30d", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["dry_run"] is True
    assert report["runs"] == 2
    assert report["runs_by_status"] == {"completed": 1, "failed": 1}
    assert (report["steps"], report["events"], report["tool_records"]) == (8, 16, 4)
    assert report["ancestors_kept"] == 1
    assert row_counts(engine) == before
    engine.dispose()


def test_prune_says_what_it_deleted(seeded: str) -> None:
    result = cli("--older-than", "720h", "--status", "completed")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "deleted 1 run(s) (1 completed) with 4 steps, 8 events, 2 tool records"
    assert lines[1] == "kept 1 run(s) that are fork ancestors of runs kept"
    assert lines[2].startswith("1 batch(es) in ")
    again = json.loads(cli("--older-than", "30d", "--json").stdout)
    assert again["runs_by_status"] == {"failed": 1}
    assert again["seconds"] >= 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--older-than", "30x"], "cannot read the age '30x'"),
        (["--older-than", "30d", "--status", "running"], "only finished runs are pruned"),
    ],
)
def test_bad_requests_are_one_line_errors(seeded: str, args: list[str], fragment: str) -> None:
    assert_one_line_error(cli(*args), fragment)
