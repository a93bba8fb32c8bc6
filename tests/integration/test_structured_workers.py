"""Structured answers in real workers on the embedded default (SQLite, the
filesystem broker): a worker SIGKILLed after an invalid answer came, before
its step's checkpoint, loses nothing and buys nothing twice; the next one
records the retry, asks again, and the run's result is the JSON object in
``harness show --json``. The providers are the official SDKs talking HTTP to
the local server of both wire formats (tests.wire)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import api
from harness.records import RunStatus
from tests.cluster import Cluster
from tests.wire import WireServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

HARNESS = str(Path(sys.executable).with_name("harness"))


def harness_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [HARNESS, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def answer(provider: str, value: dict[str, Any]) -> dict[str, Any]:
    """The structured answer as each provider gives it (the Anthropic agent has
    a tool of its own, so the final-answer tool is offered, not forced)."""
    return (
        {"json": value, "json_tool": "final_answer"} if provider == "anthropic" else {"json": value}
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_sigkill_after_an_invalid_answer_neither_loses_nor_repeats_the_retry(
    make_cluster: Callable[..., Cluster], wire: WireServer, provider: str
) -> None:
    c = make_cluster("filesystem")
    c.beat()
    goal = f"receipt from {provider}"
    # Valid JSON of the schema (OpenAI's strict mode lets it through), refused by the validator.
    wire.script(
        goal,
        [
            answer(provider, {"effect": 1, "done": False}),
            answer(provider, {"effect": 1, "done": True}),
        ],
    )
    doomed = c.worker("--pool=solo", env={"HARNESS_CRASH_AT": "after_model_returned"})
    run_id = api.start_run(f"structured-{provider}", goal)
    c.wait_until("the armed worker to kill itself", lambda: doomed.proc.poll() is not None)
    assert doomed.proc.returncode == -9
    c.kill(doomed)
    c.worker()
    (run,) = c.wait_all([run_id], timeout=60)
    assert run.status is RunStatus.COMPLETED, run.error

    # The invalid answer was read back from its record, not bought again; the
    # retry was asked once.
    assert (wire.calls(goal, 0), wire.billed(goal, 0)) == (1, 1)
    assert (wire.calls(goal, 1), wire.billed(goal, 1)) == (1, 1)
    shown = json.loads(harness_cli(c.env, "show", run_id, "--json"))
    assert shown["result"] == {"effect": 1, "done": True}
    invalid, final = shown["steps"]
    assert invalid["result"]["invalid"] == (
        "1 validation error for Receipt: done: Value error, say done only when it is (given false)"
    )
    assert final["args"] == {"turn": 1, "invalid_answers": 1}
    assert shown["usage"] == {"input_tokens": 30, "output_tokens": 10}  # both answers, once
    assert '"done": true' in harness_cli(c.env, "show", run_id)
