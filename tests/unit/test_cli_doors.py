"""The command line as a user runs it: real ``harness`` processes (issue 21).

Whatever a user types or configures wrong, the answer is one line and a
non-zero exit, never a traceback; an error about a run that is missing or
not moving names the store and broker the command used. The embedded
default (SQLite, the filesystem broker), the test agents, no worker.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(sys.executable).with_name("harness")


def harness(cwd: Path, *argv: str | bytes, **env: str) -> subprocess.CompletedProcess[str]:
    """``harness ARGV`` in ``cwd``, with the environment a user would have."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    base |= {"PYTHONPATH": str(REPO), "HARNESS_IMPORTS": "tests.agents", "LANG": "C.UTF-8"}
    return subprocess.run(
        [os.fsencode(HARNESS), *(a if isinstance(a, bytes) else a.encode() for a in argv)],
        cwd=cwd,
        env=base | env,
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=60,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one line of a refused command (``error: ...``, or click's usage error)."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    if code == 1:
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("error: ")
        return lines[0]
    return done.stderr


def started(cwd: Path, run_id: str = "r1") -> str:
    done = harness(cwd, "start", "chain", "count", "--run-id", run_id)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "a"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def with_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose store holds the pending run ``r1``, for commands that are
    refused (they change nothing, so the tests share it)."""
    path = tmp_path_factory.mktemp("with-run")
    started(path)
    return path


# -- a run that is missing, or not moving, names the store and broker ------------------------


def test_a_run_started_in_another_folder_is_missing_here_and_says_where(
    folder: Path, tmp_path: Path
) -> None:
    run_id = started(folder)
    other = tmp_path / "b"
    other.mkdir()
    line = refused(harness(other, "show", run_id))
    assert line == (
        f"error: no run with id '{run_id}' (this command used store "
        f"sqlite:///{other / 'harness.db'}, broker filesystem:// in {other / '.harness/broker'}; "
        "its path is relative to the working folder: give workers and commands the same "
        "absolute HARNESS_DATABASE_URL and HARNESS_HOME)"
    )
    for command in (["history", run_id], ["wait", run_id], ["cancel", run_id]):
        assert f"store sqlite:///{other / 'harness.db'}" in refused(harness(other, *command))


def test_a_pinned_store_masks_its_passwords_and_gives_no_folder_hint(folder: Path) -> None:
    db = folder / "pinned.db"
    pinned = {
        "HARNESS_DATABASE_URL": f"sqlite:///{db}",
        "HARNESS_BROKER_URL": "redis://:s3cret@127.0.0.1:1/0",
    }
    line = refused(harness(folder, "show", "nope", **pinned))
    assert line == (
        f"error: no run with id 'nope' (this command used store sqlite:///{db}, "
        "broker redis://:***@127.0.0.1:1/0)"
    )


def test_wait_on_a_run_no_worker_took_says_where_it_looked(folder: Path) -> None:
    run_id = started(folder)
    done = harness(folder, "wait", run_id, "--timeout", "0.2")
    assert done.returncode == 2
    assert done.stdout == f"{run_id} pending\n"
    assert done.stderr == (
        f"{run_id} is still pending after 0.2s: no worker took its first step; is one running "
        f"on the same store and broker? (this command used store sqlite:///{folder / 'harness.db'}"
        f", broker filesystem:// in {folder / '.harness/broker'}; its path is relative to the "
        "working folder: give workers and commands the same absolute HARNESS_DATABASE_URL and "
        "HARNESS_HOME)\n"
    )


# -- arguments that are not UTF-8 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([b"start", b"chain", b"\xff"], "GOAL: is not UTF-8 text (the byte 0xff at 0)"),
        ([b"start", b"ch\xe9ain", b"goal"], "AGENT: is not UTF-8 text (the byte 0xe9 at 2)"),
        ([b"show", b"r\xff"], "RUN_ID: is not UTF-8 text (the byte 0xff at 1)"),
        ([b"list", b"--agent", b"\xff"], "--agent: is not UTF-8 text (the byte 0xff at 0)"),
        (
            [b"cancel", b"r1", b"--reason", b"\xfe"],
            "--reason: is not UTF-8 text (the byte 0xfe at 0)",
        ),
        ([b"start", b"chain", b"g", b"--run-id", b"\xff"], "--run-id: is not UTF-8 text"),
    ],
)
def test_an_argument_that_is_not_utf8_is_refused_naming_it(
    with_run: Path, argv: Sequence[bytes], said: str
) -> None:
    assert refused(harness(with_run, *argv)).startswith(f"error: {said}")


def test_refused_arguments_wrote_nothing(with_run: Path) -> None:
    listed = harness(with_run, "list", "--json")
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["r1"]
    assert json.loads(harness(with_run, "show", "r1", "--json").stdout)["status"] == "pending"


def test_a_file_name_that_is_not_utf8_is_still_a_file_name(folder: Path) -> None:
    started(folder)
    path = os.fsencode(folder) + b"/r\xff.json"
    assert harness(folder, b"export", b"r1", b"--output", path).returncode == 0
    imported = harness(folder, b"import", path, HARNESS_DATABASE_URL=f"sqlite:///{folder}/b.db")
    assert imported.returncode == 0, imported.stderr
    assert "Traceback" not in refused(harness(folder, b"import", b"missing-\xff.json"))


# -- a stored approval of any shape --------------------------------------------------------------


@pytest.mark.parametrize(
    ("approval", "shown"),
    [
        ("{}", "(decided)"),
        ('{"decision": "approved"}', "(approved)"),
        ('{"by": 7, "at": "noon"}', "(decided by 7)"),
        ("[1]", "(decided: [1])"),
    ],
)
def test_show_renders_any_approval_a_step_holds(folder: Path, approval: str, shown: str) -> None:
    """An approval is written by the harness, or by whoever wrote an imported
    archive: `show` must not depend on its fields."""
    started(folder)
    with sqlite3.connect(folder / "harness.db") as db:
        db.execute("UPDATE harness_steps SET approval = ? WHERE run_id = 'r1'", (approval,))
    done = harness(folder, "show", "r1")
    assert done.returncode == 0, done.stderr
    assert shown in done.stdout
    assert harness(folder, "show", "r1", "--json").returncode == 0


# -- agent code that fails to import -------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("raise RuntimeError('boom')\n", "importing 'badagents' raised RuntimeError: boom"),
        ("def (:\n", "importing 'badagents' raised SyntaxError: invalid syntax"),
        ("import no_such_dependency\n", "cannot import 'badagents': No module named"),
    ],
)
def test_an_agent_module_that_raises_on_import_is_one_line(
    folder: Path, code: str, said: str
) -> None:
    (folder / "badagents.py").write_text(code)
    line = refused(harness(folder, "start", "chain", "goal", HARNESS_IMPORTS="badagents"))
    assert line.startswith(f"error: HARNESS_IMPORTS: {said}")


# -- options out of range ------------------------------------------------------------------------

DEEP = "[" * 50_000 + "]" * 50_000


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["history", "r1", "--after", "1" + "0" * 20], 2, "is not in the range"),
        (["approve", "r1", "--step", "1" + "0" * 20], 2, "is not in the range"),
        (["fork", "r1", "--at", "1" + "0" * 20], 2, "is not in the range"),
        (["wait", "r1", "--timeout", "nan"], 2, "is not a number of seconds"),
        (["health", "--worker", "--max-age", "inf"], 2, "is not a number of seconds"),
        (["demo", "--kill-delay", "nan"], 2, "is not a number of seconds"),
        (["replay", "r1", "--agent", "chain", "--timeout", "nan"], 2, "is not a number of seconds"),
        (["approve", "r1", "--args", DEEP], 2, "nested deeper than 64 levels"),
        (["resolve", "r1", "--succeeded", DEEP], 2, "nested deeper than 64 levels"),
        (["resolve", "r1", "--succeeded", "1" * 5000], 2, "digits"),
        (["approve", "r1", "--args", '{"a": NaN}'], 1, "error: --args: at a: nan is not a JSON"),
        (["resolve", "r1", "--succeeded", "[Infinity]"], 1, "error: --succeeded: at [0]: inf"),
    ],
)
def test_options_the_store_cannot_take_are_refused(
    with_run: Path, argv: list[str], code: int, said: str
) -> None:
    assert said in refused(harness(with_run, *argv), code)


def test_follow_stopped_by_ctrl_c_exits_130_without_a_traceback(folder: Path) -> None:
    run_id = started(folder)  # no worker: the run waits, and follow with it
    base = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env = base | {"PYTHONPATH": str(REPO), "HARNESS_IMPORTS": "tests.agents"}
    follow = subprocess.Popen(
        [HARNESS, "follow", run_id],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    first = follow.stdout.readline()  # the run's creation: the feed is under way
    assert "pending" in first
    follow.send_signal(signal.SIGINT)
    out, err = follow.communicate(timeout=30)
    assert follow.returncode == 130, (out, err)
    assert "Traceback" not in err + out


def test_follow_shows_text_a_terminal_cannot_print_without_a_traceback(folder: Path) -> None:
    run_id = started(folder)
    url = f"sqlite:///{folder / 'harness.db'}"
    from harness.store.sql import SQLStore
    from harness.store.values import StreamEntry, StreamKind

    store = SQLStore.from_url(url)
    store.append_stream(run_id, [StreamEntry(0, 1, StreamKind.TOKEN, "half \ud800 a pair")], 1.0)
    store.close()
    done = harness(folder, "cancel", run_id)  # ended: follow reads it to its end
    assert done.returncode == 0, done.stderr
    done = harness(folder, "follow", run_id)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "half ? a pair" in done.stdout
