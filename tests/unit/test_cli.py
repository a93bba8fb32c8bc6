"""The command line, against the embedded store and broker (no worker runs).

``start`` really enqueues a message on the ``filesystem://`` broker; nothing
consumes it, so runs stay ``pending`` unless the test cancels them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from harness import api
from harness.cli import main
from harness.store.migrate import head_revision


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> Path:
    """The embedded setup with the test agents; returns HARNESS_HOME."""
    home = tmp_path / ".harness"
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    monkeypatch.setenv("HARNESS_HOME", str(home))
    return home


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def ok_json(*args: str) -> Any:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert result.exception is None
    return json.loads(result.stdout)


def start(*args: str) -> str:
    run_id = ok_json("start", "chain", "count to three", "--json", *args)["run_id"]
    assert isinstance(run_id, str)
    return run_id


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """A handled error: one ``error:`` line on stderr, non-zero exit, no traceback."""
    # CliRunner catches unhandled exceptions, which a user would see as a traceback.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


# -- start ---------------------------------------------------------------------


@pytest.mark.usefixtures("env")
def test_start_json_prints_the_run_id() -> None:
    result = cli("start", "chain", "count", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data) == ["run_id"]
    assert len(data["run_id"]) == 32


@pytest.mark.usefixtures("env")
def test_start_without_json_prints_the_bare_id() -> None:
    result = cli("start", "chain", "count", "--run-id", "plain-1")
    assert result.exit_code == 0, result.output
    assert result.stdout == "plain-1\n"


@pytest.mark.usefixtures("env")
def test_start_with_an_explicit_run_id_is_idempotent() -> None:
    assert start("--run-id", "fixed-1") == "fixed-1"
    assert start("--run-id", "fixed-1") == "fixed-1"
    runs = ok_json("list", "--json")
    assert [r["run_id"] for r in runs] == ["fixed-1"]
    assert ok_json("show", "fixed-1", "--json")["version"] == 1


@pytest.mark.usefixtures("env")
def test_start_without_run_id_makes_a_new_run_each_time() -> None:
    assert start() != start()


def test_start_enqueues_under_the_current_harness_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The embedded broker lives under HARNESS_HOME, read when the runtime is built,
    like every other setting (the runtime is rebuilt after the environment changes)."""
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    for name in ("first", "second"):
        api.reset_runtime()
        monkeypatch.setenv("HARNESS_DATABASE_URL", f"sqlite:///{tmp_path / name}.db")
        monkeypatch.setenv("HARNESS_HOME", str(tmp_path / name))
        start()
        queue = tmp_path / name / "broker" / "queue"
        messages = list(queue.glob("*.msg")) if queue.is_dir() else []
        assert len(messages) == 1, f"no step message under {queue}"


# -- show / list / history -----------------------------------------------------


@pytest.mark.usefixtures("env")
def test_show_json_of_a_fresh_run() -> None:
    run_id = start()
    data = ok_json("show", run_id, "--json")
    assert data["run_id"] == run_id
    assert data["agent"] == "chain"
    assert data["goal"] == "count to three"
    assert data["status"] == "pending"
    assert data["cursor"] == 0
    assert data["version"] == 1
    assert data["error"] is None
    assert len(data["steps"]) == 1
    step = data["steps"][0]
    assert step["index"] == 0
    assert step["kind"] == "model"
    assert step["status"] == "pending"
    assert step["attempts"] == 0
    assert step["error"] is None


@pytest.mark.usefixtures("env")
def test_show_without_json_mentions_the_run() -> None:
    run_id = start()
    result = cli("show", run_id)
    assert result.exit_code == 0, result.output
    assert run_id in result.stdout
    assert "pending" in result.stdout


@pytest.mark.usefixtures("env")
def test_list_json() -> None:
    assert ok_json("list", "--json") == []
    first, second = start(), start()
    runs = ok_json("list", "--json")
    assert {r["run_id"] for r in runs} == {first, second}
    assert all(r["status"] == "pending" and r["agent"] == "chain" for r in runs)


@pytest.mark.usefixtures("env")
def test_list_filters_by_status() -> None:
    keep, drop = start(), start()
    ok_json("cancel", drop, "--json")
    assert [r["run_id"] for r in ok_json("list", "--status", "pending", "--json")] == [keep]
    assert [r["run_id"] for r in ok_json("list", "--status", "cancelled", "--json")] == [drop]


@pytest.mark.usefixtures("env")
def test_list_pages_with_a_cursor_and_filters_by_agent() -> None:
    runs = [start() for _ in range(3)]
    first = cli("list", "--limit", "2", "--json")
    assert first.exit_code == 0, first.output
    page = [r["run_id"] for r in json.loads(first.stdout)]
    assert first.stderr.startswith("next page: --cursor ")
    cursor = first.stderr.split()[-1]
    rest = cli("list", "--limit", "2", "--cursor", cursor, "--json")
    assert rest.exit_code == 0, rest.output
    assert rest.stderr == ""
    assert sorted(page + [r["run_id"] for r in json.loads(rest.stdout)]) == sorted(runs)
    table = cli("list", "--limit", "1")
    assert table.stdout.rstrip().splitlines()[-1].startswith("next page: --cursor ")
    assert len(ok_json("list", "--agent", "chain", "--json")) == 3
    assert ok_json("list", "--agent", "mailer", "--json") == []
    assert_one_line_error(cli("list", "--cursor", "nope"), "not a cursor")


@pytest.mark.usefixtures("env")
def test_history_after_an_event_id() -> None:
    run_id = start()
    ok_json("cancel", run_id, "--json")
    events = ok_json("history", run_id, "--json")
    assert [e["to"] for e in events] == ["pending", "cancelled"]
    after = ok_json("history", run_id, "--after", str(events[0]["id"]), "--json")
    assert after == events[1:]


@pytest.mark.usefixtures("env")
def test_history_json_has_the_pending_event() -> None:
    run_id = start()
    events = ok_json("history", run_id, "--json")
    assert len(events) >= 1
    first = events[0]
    assert first["run_id"] == run_id
    assert first["to"] == "pending"
    assert first["version"] == 1


# -- wait / cancel / sweep -----------------------------------------------------


@pytest.mark.usefixtures("env")
def test_wait_times_out_with_exit_2_for_a_pending_run() -> None:
    run_id = start()
    result = cli("wait", run_id, "--timeout", "0")  # one look, no waiting on real time
    assert result.exit_code == 2
    assert result.stdout == f"{run_id} pending\n"


@pytest.mark.usefixtures("env")
def test_cancel_then_show_and_wait() -> None:
    run_id = start()
    result = cli("cancel", run_id)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{run_id} cancelled\n"

    data = ok_json("show", run_id, "--json")
    assert data["status"] == "cancelled"
    assert data["error"] == "cancelled by operator"
    assert data["version"] == 2

    waited = cli("wait", run_id, "--timeout", "0.3")
    assert waited.exit_code == 0, waited.output
    assert waited.stdout.startswith(f"{run_id} cancelled")


@pytest.mark.usefixtures("env")
def test_cancel_is_idempotent_and_keeps_the_first_reason() -> None:
    run_id = start()
    first = ok_json("cancel", run_id, "--reason", "first", "--json")
    second = ok_json("cancel", run_id, "--reason", "second", "--json")
    assert first["status"] == second["status"] == "cancelled"
    assert second["error"] == "first"
    assert second["version"] == first["version"]


@pytest.mark.usefixtures("env")
def test_sweep_right_after_start_finds_nothing_due() -> None:
    start()
    assert ok_json("sweep", "--json") == []


@pytest.mark.usefixtures("env")
def test_sweep_without_json_reports_a_count() -> None:
    result = cli("sweep")
    assert result.exit_code == 0, result.output
    assert result.stdout == "0 run(s) re-dispatched\n"


# -- migrate -------------------------------------------------------------------


def test_migrate_prints_the_revision(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    result = cli("migrate")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"run store at revision {head_revision()}: sqlite:///")
    again = cli("migrate")
    assert again.exit_code == 0, again.output
    assert again.stdout == result.stdout


# -- errors: one line, non-zero, no traceback ----------------------------------


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize(
    "command",
    [
        ["show", "nope"],
        ["show", "nope", "--json"],
        ["history", "nope", "--json"],
        ["wait", "nope", "--timeout", "0"],
        ["cancel", "nope"],
    ],
)
def test_unknown_run_id(command: list[str]) -> None:
    assert_one_line_error(cli(*command), "no run with id 'nope'")


@pytest.mark.usefixtures("env")
def test_unknown_agent_lists_registered_agents() -> None:
    result = cli("start", "no-such-agent", "goal", "--json")
    assert_one_line_error(result, "no agent named 'no-such-agent'", "known agents")
    for name in ("chain", "long-chain", "mailer", "slow-chain"):
        assert name in result.stderr
    assert ok_json("list", "--json") == []


@pytest.mark.parametrize("command", [["list", "--json"], ["migrate"], ["show", "x"]])
def test_malformed_database_url(monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", "notaurl")
    assert_one_line_error(cli(*command), "malformed database URL 'notaurl'")


@pytest.mark.parametrize("command", [["list", "--json"], ["migrate"], ["show", "x"]])
def test_unreachable_database(monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", "postgresql+psycopg://postgres:s3cret@127.0.0.1:1/x")
    result = cli(*command)
    # The store is named, so a user sees which one; its password is not (issue 21).
    assert_one_line_error(
        result, "cannot reach the run store postgresql+psycopg://postgres:***@127.0.0.1:1/x: "
    )
    assert "s3cret" not in result.output


@pytest.mark.parametrize("command", [["list", "--json"], ["migrate"], ["show", "x"]])
def test_a_postgres_url_says_use_postgresql(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", "postgres://u:s3cret@db/h")
    result = cli(*command)
    assert_one_line_error(result, "'postgres://u:***@db/h'", "use postgresql://")
    assert "s3cret" not in result.output


@pytest.mark.parametrize("command", [["list", "--json"], ["migrate"]])
def test_sqlite_database_in_a_missing_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: list[str]
) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", f"sqlite:///{tmp_path / 'missing' / 'h.db'}")
    assert_one_line_error(cli(*command))


@pytest.mark.parametrize(
    "command", [["list", "--json"], ["start", "chain", "goal"], ["sweep", "--json"], ["migrate"]]
)
def test_bad_lease_ttl(monkeypatch: pytest.MonkeyPatch, env: Path, command: list[str]) -> None:
    monkeypatch.setenv("HARNESS_LEASE_TTL", "abc")
    assert_one_line_error(cli(*command), "HARNESS_LEASE_TTL='abc' is not a number")


def test_unimportable_harness_imports(monkeypatch: pytest.MonkeyPatch, env: Path) -> None:
    """Starting a run needs the agents; reading runs does not (issue 8)."""
    run_id = start()
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.no_such_module")
    api.reset_runtime()
    result = cli("start", "chain", "goal", "--json")
    assert_one_line_error(result, "HARNESS_IMPORTS", "tests.no_such_module")
    assert [r["run_id"] for r in ok_json("list", "--json")] == [run_id]
    assert ok_json("show", run_id, "--json")["status"] == "pending"
    assert ok_json("history", run_id, "--json")[0]["to"] == "pending"
    assert ok_json("stats", "--json")["runs_by_status"] == {"pending": 1}


def test_fixing_the_environment_after_reset_runtime_recovers(
    monkeypatch: pytest.MonkeyPatch, env: Path
) -> None:
    monkeypatch.setenv("HARNESS_LEASE_TTL", "abc")
    assert_one_line_error(cli("list", "--json"))
    monkeypatch.delenv("HARNESS_LEASE_TTL")
    api.reset_runtime()
    assert ok_json("list", "--json") == []
