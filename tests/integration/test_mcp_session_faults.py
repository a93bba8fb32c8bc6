"""One MCP session per server per process, shared by every thread's calls:
what one caller's failure may and may not do to the others', and what counts
as a call sent. Against our own server (tests.mcp_server) over stdio; calls
are counted from the ledger it writes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.toolsets import ToolsetUnavailable, sessions
from tests.integration.test_mcp_tools import call, our_server, tool_of, wait_for
from tests.ledger import Ledger


@pytest.fixture(autouse=True)
def _closed_sessions() -> Iterator[None]:
    yield
    sessions.close_all()


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.txt"


def test_a_listing_the_server_refuses_leaves_a_call_in_flight_alone(ledger: Path) -> None:
    """Thread A's at_most_once call is under way; thread B lists the tools
    for a new run, and the server answers with an error: B's run waits for
    the server, A's call gets its answer on the same session."""
    server = our_server(ledger)
    assert server.list_offered()
    hold = Path(f"{ledger}.hold")
    hold.touch()
    answers: list[object] = []
    failures: list[BaseException] = []

    def send() -> None:
        try:
            answers.append(call(tool_of(server, "held_send"), {"to": "bob"}, "r", 1))
        except BaseException as err:  # noqa: BLE001 - the test reports it
            failures.append(err)

    caller = threading.Thread(target=send)
    caller.start()
    wait_for("the call under way", lambda: ledger.exists() and " r:1 " in ledger.read_text())
    Path(f"{ledger}.unlisted").touch()
    with pytest.raises(ToolsetUnavailable, match="listing its tools failed: MCPError"):
        server.list_offered()
    assert server.connected()
    hold.unlink()
    caller.join(30)
    assert not failures and answers == [{"result": "sent to bob"}]
    assert Ledger.read(ledger).by_key.keys() == {"r:1"}
    Path(f"{ledger}.unlisted").unlink()
    assert server.list_offered()  # the same server answers again
