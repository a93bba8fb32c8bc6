"""What README.md says is what the code does (issue 21: statements that were false).

The quickstart itself runs in tests/integration/test_readme_quickstart.py;
here, the claims that can be checked without workers: an error message quoted
from the API, the examples' agent names, the connections a process keeps.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from harness import agents, api
from harness.store.sql import DEFAULT_POOL
from harness.web.app import create_app

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _quoted_after(command: str) -> str:
    """The output line the README shows right after ``$ COMMAND``."""
    lines = README.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("$ ") and command in line:
            return lines[i + 1].split("  #")[0].rstrip()
    raise AssertionError(f"the README shows no `{command}`")


def test_the_status_error_quoted_is_the_apis_whole_answer(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    """Pydantic writes the list from the RunStatus enum; the README quotes it
    whole, so a new status (diverged) shows here first."""
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    with TestClient(create_app("s3cret")) as client:
        answer = client.get("/api/runs?status=sleeping", headers={"Authorization": "Bearer s3cret"})
    api.reset_runtime()
    assert answer.status_code == 422
    assert _quoted_after("/api/runs?status=sleeping") == answer.text


def _commands_after(prose: str) -> list[list[str]]:
    """The command lines of the first console block after ``prose``."""
    block = re.search(re.escape(prose) + r".*?```console\n(.*?)```", README, flags=re.S)
    assert block, f"no console block after {prose!r}"
    lines = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    return [line for line in lines if line]


@pytest.mark.parametrize(
    ("prose", "module"),
    [
        ("`examples/weather.py` is an agent on a real model", "examples.weather"),
        ("`examples/offline.py` is the same agent on a scripted model", "examples.offline"),
        ("`examples/courier.py` is an agent whose tool books a pickup", "examples.courier"),
        ("`payments` is an agent whose tool", "examples.waiting"),
        ("`follow-up` is an agent the model can ask to", "examples.waiting"),
        ("`examples/delegation.py` is a planner that delegates", "examples.delegation"),
        ("`examples/outfit.py` is the agent below", "examples.outfit"),
        ("`examples/async_tools.py` is an agent whose tool", "examples.async_tools"),
    ],
)
def test_each_examples_commands_start_an_agent_its_module_registers(
    prose: str, module: str
) -> None:
    commands = _commands_after(prose)
    exports = dict(
        word.split("=", 1) for line in commands if line[0] == "export" for word in line[1:]
    )
    assert exports["HARNESS_IMPORTS"] == module
    (start,) = [line for line in commands if line[:2] == ["harness", "start"]]
    importlib.import_module(module)
    assert agents.get_agent(start[2]).name == start[2]


def test_the_connections_said_are_the_default_pool() -> None:
    kept, extra = DEFAULT_POOL
    assert f"keeps {kept} and opens up to {extra} more while busy" in README.replace("\n", " ")
    assert f"run store: a pool of {kept} database connections" in README.replace("\n", " ")
