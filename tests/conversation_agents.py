"""An agent that holds a conversation, for the tests of conversations with
real workers (tests/integration/test_conversation_workers.py); workers
import it through HARNESS_IMPORTS (:data:`IMPORTS`).

Its model answers each turn with the user's messages it was given, so a
test reads from the run's result what the model saw; a turn whose latest
message says "slowly" takes a second and a half, so a test can send the
next message while the model is answering (it touches :func:`answering`
as it begins)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import harness
from harness.records import StepKind

IMPORTS = "tests.agents,tests.conversation_agents"


def answering(ledger: Path | str) -> Path:
    """The file a slow turn touches as it begins to answer."""
    return Path(f"{ledger}.answering")


class Listener:
    name = "test:listener"
    records_responses = False

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        heard = [
            str(s.args.get("text"))
            for s in request.history()
            if s.kind is StepKind.USER and s.index < request.step_index
        ]
        if (heard[-1] if heard else request.goal).endswith("slowly"):
            Path(answering(os.environ["HARNESS_TEST_LEDGER"])).touch()
            time.sleep(1.5)
        return harness.ModelTurn(final=f"turn {request.turn} heard: {' | '.join(heard)}")


harness.register_agent(harness.Agent(name="listener", model=Listener(), tools=[]))
