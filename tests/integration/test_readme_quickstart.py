"""The README's first steps, exactly as written, from a fresh folder (issues 8, 21).

The "Writing an agent" snippet is parsed out of README.md and saved as the
README says, ``myagents.py`` in the folder the commands run from; that folder
stands for the clone, its ``.venv`` the virtualenv ``make install`` made (a
link to this one). Then the README's command lines run there, each as a
subprocess: ``export`` lines (``$VAR`` expanded as a shell would) change the
environment, a line ending in ``&`` starts a worker or beat in the
background, the others run to their end. The environment starts without the
virtualenv on the PATH, so the README's own PATH step is what finds
``harness`` and ``celery`` (the installed scripts: not ``python -m``, which
would put the folder on the import path by itself). Only the README's
variables are set: the embedded default, SQLite and the filesystem broker.

The console block must be :data:`COMMANDS` word for word: a change to the
README's commands fails here until this test runs (and checks) the new ones.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
#: Where the project's scripts are installed, next to this interpreter.
BIN = Path(sys.executable).parent
#: The virtualenv of this interpreter: what `make install` made in the clone.
VENV = Path(sys.prefix)
#: The quickstart's console block, as the README must give it.
COMMANDS = """\
export PATH="$PWD/.venv/bin:$PATH"
export HARNESS_IMPORTS=myagents
celery -A tasks worker &          # as many as you like, on as many machines
celery -A tasks beat &            # exactly one: the recovery sweeper
harness start support-bot "refund order 1234" --json    # {"run_id": "..."}
harness wait RUN && harness show RUN
"""


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _quickstart() -> tuple[str, str, list[list[str]]]:
    """(file name, agent code, command lines) of "Writing an agent"."""
    section = _section("Writing an agent")
    code = _blocks(section, "python")[0]
    name = re.match(r"# (\S+\.py)\n", code)
    assert name, "the snippet's first line names its file"
    block = _blocks(section, "console")[0]
    assert block == COMMANDS, "the README's quickstart changed: update COMMANDS and this test"
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    return name.group(1), code, [c for c in commands if c]


def _expanded(word: str, env: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` in ``word`` as a shell expands them."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), word)


class Folder:
    """A user's working folder, and the environment the README has them set."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Not the virtualenv: the README's PATH step puts it there.
        outside = [p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != BIN]
        self.env = {
            "PATH": os.pathsep.join(outside),
            "HOME": os.environ.get("HOME", str(path)),
            "LANG": "C.UTF-8",
            "COLUMNS": "200",  # a terminal wide enough for a run id in a table
        }
        self.daemons: list[tuple[subprocess.Popen[bytes], Path]] = []

    def export(self, assignment: str) -> None:
        name, _, value = assignment.partition("=")
        self.env[name] = _expanded(value, {**self.env, "PWD": str(self.path)})

    def run(self, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=self.path,
            env=self.env | env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    def ok(self, *argv: str, **env: str) -> str:
        done = self.run(*argv, **env)
        assert done.returncode == 0, (
            f"{argv} exited {done.returncode}: {done.stderr}\n{self.logs()}"
        )
        return done.stdout

    def start(self, argv: list[str]) -> None:
        """A long-running command (a worker, beat), its output in a log file."""
        log = self.path.parent / f"{argv[-1]}-{len(self.daemons)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=self.path,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.daemons.append((proc, log))

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in self.daemons)

    def stop(self) -> None:
        for proc, _ in self.daemons:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Folder]:
    path = tmp_path / "fresh"
    path.mkdir()
    assert (VENV / "bin" / "harness").is_file(), "the tests run in the project's virtualenv"
    (path / ".venv").symlink_to(VENV, target_is_directory=True)
    f = Folder(path)
    try:
        yield f
    finally:
        f.stop()


def test_the_readme_quickstart_works_from_a_fresh_folder(folder: Folder) -> None:
    filename, code, commands = _quickstart()
    (folder.path / filename).write_text(code)
    assert shutil.which("harness", path=folder.env["PATH"]) is None, "harness is on the PATH"
    run_id = ""
    for argv in commands:
        if argv[0] == "export":
            for assignment in argv[1:]:
                folder.export(assignment)
        elif argv[-1] == "&":
            folder.start(argv[:-1])
        elif argv[:2] == ["harness", "start"]:
            run_id = json.loads(folder.ok(*argv))["run_id"]
        else:  # `harness wait RUN && harness show RUN`
            assert run_id, f"{argv} before any run was started"
            line = [run_id if word == "RUN" else word for word in argv]
            while "&&" in line:
                cut = line.index("&&")
                folder.ok(*line[:cut])
                line = line[cut + 1 :]
            folder.ok(*line)
    assert folder.env["PATH"].startswith(f"{folder.path}/.venv/bin{os.pathsep}")
    assert folder.env.get("HARNESS_IMPORTS") == "myagents"
    assert run_id, "the README starts a run"
    # The worker said which store and broker it uses: this folder's.
    worker_log = folder.daemons[0][1].read_text()
    assert (
        f"harness: store sqlite:///{folder.path / 'harness.db'}, "
        f"broker filesystem:// in {folder.path / '.harness' / 'broker'}"
    ) in worker_log.splitlines(), worker_log[:2000]

    shown = json.loads(folder.ok("harness", "show", run_id, "--json"))
    assert shown["status"] == "completed", f"{shown}\n{folder.logs()}"
    assert shown["result"] == "Refunded."
    tools = [(s["tool"], s["status"]) for s in shown["steps"] if s["kind"] == "tool"]
    assert tools == [("lookup_order", "done"), ("issue_refund", "done")]
    assert shown["steps"][3]["result"]["key"] == f"{run_id}:3"

    assert run_id in folder.ok("harness", "list")
    assert [r["run_id"] for r in json.loads(folder.ok("harness", "list", "--json"))] == [run_id]
    history = json.loads(folder.ok("harness", "history", run_id, "--json"))
    assert history[0]["to"] == "pending" and history[-1]["to"] == "completed"
    assert json.loads(folder.ok("harness", "stats", "--json"))["runs_by_status"] == {"completed": 1}

    # Reading runs needs no agent code: it works where the agents cannot be imported.
    missing = {"HARNESS_IMPORTS": "no_such_agents"}
    assert json.loads(folder.ok("harness", "show", run_id, "--json", **missing))["status"] == (
        "completed"
    )
    assert run_id in folder.ok("harness", "list", **missing)
    assert folder.ok("harness", "history", run_id, **missing)
    assert folder.ok("harness", "stats", **missing)
    refused = folder.run("harness", "start", "support-bot", "again", **missing)
    assert refused.returncode == 1
    assert refused.stderr == (
        "error: HARNESS_IMPORTS: cannot import 'no_such_agents': No module named 'no_such_agents'\n"
    )

    # From another folder the embedded default is another store, and the error says so.
    elsewhere = folder.path / "elsewhere"
    elsewhere.mkdir()
    lost = subprocess.run(
        ["harness", "show", run_id],
        cwd=elsewhere,
        env=folder.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lost.returncode == 1
    assert lost.stderr.startswith(
        f"error: no run with id '{run_id}' (this command used store "
        f"sqlite:///{elsewhere / 'harness.db'}, broker filesystem:// in "
    )
