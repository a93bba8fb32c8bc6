"""An agent whose answer is written while a test watches, for the dashboard's
live answer (tests/integration/test_dashboard_conversation.py); workers
import it through HARNESS_IMPORTS.

Its model streams the first half of its answer, then waits until the test
opens its gate (a file beside the ledger, :func:`gate`) before it writes the
rest and answers: the test sees the half-written answer while the step is
still running, for as long as it needs, with no timing to guess."""

from __future__ import annotations

import os
import time
from pathlib import Path

import harness

#: The answer, in the two pieces it is written in.
FIRST, REST = "Once upon ", "a time."
#: How long the model waits for its gate before it gives up.
PATIENCE = 60.0


def gate(ledger: Path | str, run_id: str) -> Path:
    """The file that lets the run's model write the rest of its answer."""
    return Path(f"{ledger}.{run_id}.go")


class Writer:
    name = "test:writer"
    records_responses = False

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        opened = gate(os.environ["HARNESS_TEST_LEDGER"], request.run_id)
        if request.on_text is not None:
            request.on_text(FIRST)
        deadline = time.monotonic() + PATIENCE
        while not opened.exists():
            if time.monotonic() > deadline:
                raise harness.ModelError(f"the test never opened {opened}")
            time.sleep(0.02)
        if request.on_text is not None:
            request.on_text(REST)
        return harness.ModelTurn(final=FIRST + REST)


harness.register_agent(harness.Agent(name="writer", model=Writer(), tools=[]))
